#pragma once
/// \file normalization.hpp
/// layer_norm and rms_norm along the last axis, and their backward rules; layer_norm with a
/// gain and a bias (PyTorch's weight and bias) as one op: layer_norm(x) * gain + bias in one pass,
/// the three ops' scales and roundings (see layer_norm(x, gain, bias)).
///
/// Both are computed on the data, never on the value: x = d s gives layer_norm(x) =
/// (d - mean d) / sqrt(var d + eps / s^2), so no input scale can overflow the sum of squares (the
/// first design document's "stable reduce mean"), and the output does not depend on the input's
/// scale at all. The output has unit variance (RMS) by construction: natural scale 1, which
/// unit_scaling keeps; eps is in the value's units, as PyTorch's.
///
///     auto h = layer_norm<unit_scaling>(x);          // (..., N), normalised over N
///     auto [gx] = layer_norm_vjp<unit_scaling>(g, x); // recomputes the lane statistics from x
///
/// The gradient dx = (g - mean g - y mean(g y)) / sigma (layer_norm; rms_norm drops the mean g
/// term) has natural scale s_g / s_x; unit_scaling's rule keeps (N - 2) / N (layer_norm) or
/// (N - 1) / N (rms_norm) of a unit cotangent's variance (docs/ops.md).

#include <scalify/detail/lane_reduce.hpp>
#include <scalify/detail/parallel.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/math.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/reduce.hpp>
#include <scalify/ops/result.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/scaling.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace scalify {

namespace detail {

/// The lanes of the last axis: `lanes` of `length` contiguous elements. shape_error for 0-d
/// input or a bad eps.
template <class T, class P>
[[nodiscard]] std::size_t normalised_length(const char* op, const ScaledArray<T, P>& x, double eps)
{
    if (x.dimension() == 0) {
        SCALIFY_THROW(shape_error(fmt::format("{}: a 0-d array has no axis to normalise", op)));
    }
    if (!(eps >= 0.0) || !std::isfinite(eps)) {
        SCALIFY_THROW(config_error(fmt::format("{}: eps must be finite and >= 0, got {}", op, eps)));
    }
    return x.shape()[x.dimension() - 1];
}

/// (x - mean) / sigma of one datum in double, as every layer-norm pass computes it from the lane
/// statistics: 0 for a zero-scale x, whatever its data hold (inf, NaN).
template <class T>
[[nodiscard, gnu::always_inline]] inline double normalised_value(const T& x, bool zero_scale, double mean, double inverse_sigma) noexcept
{
    return bit_select(zero_scale, 0.0, (double(load(x)) - mean) * inverse_sigma);
}

/// Per lane of the data: the mean (0 unless Centred) and 1 / sqrt(variance + eps / s^2), with
/// variance the mean square about that mean; sums in double (lane_sum's order). A zero-scale x
/// is zeros: mean 0 and 1 / sqrt(eps) in the value's units (returned as `zero_scale`).
template <bool Centred, class T, class P>
struct lane_statistics {
    std::vector<double> mean, inverse_sigma;
    bool zero_scale = false;

    lane_statistics(const ScaledArray<T, P>& x, std::size_t length, double eps)
    {
        const std::size_t lanes = length == 0 ? 0 : x.size() / length;
        mean.assign(lanes, 0.0);
        inverse_sigma.assign(lanes, 0.0);
        const double s = x.scale();
        zero_scale = s == 0.0;
        const T* d = x.data().data();
        const double eps_data = zero_scale ? eps : eps / (s * s);
        parallel_lanes(lanes, length, [&](std::size_t first, std::size_t last) {
            for (std::size_t lane = first; lane < last; ++lane) {
                const T* row = d + lane * length;
                double mu = 0.0;
                if constexpr (Centred) {
                    if (!zero_scale) mu = lane_sum<double>(length, [row](std::size_t i) { return double(load(row[i])); }) / double(length);
                }
                double squares = 0.0;
                if (!zero_scale) {
                    squares = lane_sum<double>(length, [row, mu](std::size_t i) {
                        const double centred = double(load(row[i])) - mu;
                        return centred * centred;
                    });
                }
                mean[lane] = mu;
                inverse_sigma[lane] = 1.0 / std::sqrt(squares / double(length) + eps_data);
            }
        });
    }
};

/// The normalised x from its lane statistics (computed by the caller, who may keep them for the
/// backward rule).
template <class Op, bool Centred, class Strategy, class Out, class T, class P>
[[nodiscard]] auto normalise_last_axis(const char* op, const ScaledArray<T, P>& x, double eps,
                                       const lane_statistics<Centred, T, P>& stats)
{
    using C = compute_t<T>;
    const std::size_t length = normalised_length(op, x, eps);
    scale_request request;
    request.natural = 1.0f;
    request.input_scales[0] = x.scale();
    request.axis_length = length;
    const T* d = x.data().data();
    const double* mean = stats.mean.data();
    const double* inverse_sigma = stats.inverse_sigma.data();
    const bool zero = stats.zero_scale;  // x is zeros, whatever its data hold (inf, NaN)
    const auto at = [=](std::size_t i, std::size_t, std::size_t lane) {
        return static_cast<C>(normalised_value(d[i], zero, mean[lane], inverse_sigma[lane]));
    };
    return finish<Op, Strategy, P, out_or_t<Out, T>, C>(op, x.shape(), request,
                                                        periodic_source<decltype(at)>{at, std::max<std::size_t>(length, 1)});
}

template <class Op, bool Centred, class Strategy, class Out, class T, class P>
[[nodiscard]] auto normalise_last_axis(const char* op, const ScaledArray<T, P>& x, double eps)
{
    return normalise_last_axis<Op, Centred, Strategy, Out>(op, x, eps,
                                                          lane_statistics<Centred, T, P>(x, normalised_length(op, x, eps), eps));
}

/// normalise_last_axis_vjp's body (see binary_body).
template <class Op, bool Centred, class Strategy, class Out, class G, class PG, class T, class P>
[[nodiscard]] auto normalise_last_axis_vjp_body(const char* op, const ScaledArray<G, PG>& g, const ScaledArray<T, P>& x,
                                                double eps, const lane_statistics<Centred, T, P>& stats)
{
    using C = compute_t<G>;
    const std::size_t length = normalised_length(op, x, eps);
    if (!std::equal(g.shape().begin(), g.shape().end(), x.shape().begin(), x.shape().end())) {
        SCALIFY_THROW(shape_error(fmt::format("{}: cotangent shape {} differs from the input's {}", op,
                                              shape_string(g.shape()), shape_string(x.shape()))));
    }
    const std::size_t lanes = length == 0 ? 0 : x.size() / length;
    const T* d = x.data().data();
    const G* gd = g.data().data();
    const double* mean = stats.mean.data();
    const double* inverse_sigma = stats.inverse_sigma.data();
    const bool zero = stats.zero_scale;  // y = 0 for a zero-scale x, whatever its data hold
    const auto y_at = [d, mean, inverse_sigma, zero](std::size_t i, std::size_t lane) {
        return normalised_value(d[i], zero, mean[lane], inverse_sigma[lane]);
    };
    // Per lane, mean g and mean(g y) over the cotangent's data; then each element stored straight
    // from them (a periodic_source: no buffer of raw results).
    std::vector<double> g_means(lanes, 0.0), gy_means(lanes);
    parallel_lanes(lanes, length, [&](std::size_t first, std::size_t last) {
        for (std::size_t lane = first; lane < last; ++lane) {
            const std::size_t base = lane * length;
            const G* g_row = gd + base;
            if constexpr (Centred) g_means[lane] = lane_sum<double>(length, [g_row](std::size_t i) { return double(load(g_row[i])); }) / double(length);
            gy_means[lane] = lane_sum<double>(length, [&](std::size_t i) { return double(load(g_row[i])) * y_at(base + i, lane); }) / double(length);
        }
    });
    const auto at = [gd, y_at, inverse_sigma, g_mean = g_means.data(), gy_mean = gy_means.data()](std::size_t i, std::size_t,
                                                                                                  std::size_t lane) {
        return static_cast<C>((double(load(gd[i])) - g_mean[lane] - y_at(i, lane) * gy_mean[lane]) * inverse_sigma[lane]);
    };
    // dx = (s_g / s_x) raw; a zero-scale x: inverse_sigma is already in the value's units.
    scale_request request;
    request.natural = stats.zero_scale ? g.scale() : static_cast<float>(double(g.scale()) / double(x.scale()));
    request.input_scales[0] = g.scale();
    request.input_scales[1] = x.scale();
    request.input_count = 2;
    request.axis_length = length;
    if (!std::isfinite(request.natural)) {
        SCALIFY_THROW(scale_error(fmt::format("{}: the gradient's scale {} / {} overflows float32", op, g.scale(), x.scale())));
    }
    return finish<ops::vjp<Op>, Strategy, PG, out_or_t<Out, G>, C>(op, g.shape(), request,
                                                                  periodic_source<decltype(at)>{at, std::max<std::size_t>(length, 1)});
}

/// The gradient from x's lane statistics (those its forward pass computed: the same values). A
/// cotangent of another element type than x's is read in its compute type (beside).
template <class Op, bool Centred, class Strategy, class Out, class G, class PG, class T, class P>
[[nodiscard]] auto normalise_last_axis_vjp(const char* op, const ScaledArray<G, PG>& g, const ScaledArray<T, P>& x, double eps,
                                           const lane_statistics<Centred, T, P>& stats)
{
    return normalise_last_axis_vjp_body<Op, Centred, Strategy, out_or_t<Out, G>>(op, beside<compute_t<G>, T>(g), x, eps, stats);
}

template <class Op, bool Centred, class Strategy, class Out, class G, class PG, class T, class P>
[[nodiscard]] auto normalise_last_axis_vjp(const char* op, const ScaledArray<G, PG>& g, const ScaledArray<T, P>& x, double eps)
{
    return normalise_last_axis_vjp<Op, Centred, Strategy, Out>(op, g, x, eps,
                                                              lane_statistics<Centred, T, P>(x, normalised_length(op, x, eps), eps));
}

}  // namespace detail

/// (x - mean) / sqrt(var + eps) along the last axis (PyTorch's layer_norm without weight and
/// bias; eps in the value's units). Natural scale 1, whatever x's scale.
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto layer_norm(const ScaledArray<T, P>& x, double eps = 1e-5)
{
    return detail::normalise_last_axis<ops::layer_norm, true, Strategy, Out>("layer_norm", x, eps);
}

/// x / sqrt(mean(x^2) + eps) along the last axis (PyTorch's rms_norm without weight). Natural
/// scale 1, whatever x's scale.
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto rms_norm(const ScaledArray<T, P>& x, double eps = 1e-6)
{
    return detail::normalise_last_axis<ops::rms_norm, false, Strategy, Out>("rms_norm", x, eps);
}

/// Gradient of layer_norm(x, eps) for the cotangent g, stored under ops::vjp<ops::layer_norm>.
template <class Strategy = default_scaling, class Out = void, class G, class PG, class T, class P>
[[nodiscard]] auto layer_norm_vjp(const ScaledArray<G, PG>& g, const ScaledArray<T, P>& x, double eps = 1e-5)
{
    return detail::normalise_last_axis_vjp<ops::layer_norm, true, Strategy, Out>("layer_norm_vjp", g, x, eps);
}

/// Gradient of rms_norm(x, eps) for the cotangent g, stored under ops::vjp<ops::rms_norm>.
template <class Strategy = default_scaling, class Out = void, class G, class PG, class T, class P>
[[nodiscard]] auto rms_norm_vjp(const ScaledArray<G, PG>& g, const ScaledArray<T, P>& x, double eps = 1e-6)
{
    return detail::normalise_last_axis_vjp<ops::rms_norm, false, Strategy, Out>("rms_norm_vjp", g, x, eps);
}

// ---- layer_norm with gain and bias -----------------------------------------------------------

namespace detail {

/// The scales of layer_norm(x) * gain + bias as the three ops' static rules choose them, and
/// the factors each op's store applies: what the fused op reproduces, element by element.
template <class C>
struct affine_norm_plan {
    float normalised_scale = 1.0f, product_scale = 1.0f, scale = 1.0f;
    C normalised_factor = C(1), product_factor = C(1), product_in_sum = C(1), sum_factor = C(1);
    std::vector<C> bias_in_sum;  ///< each bias datum as the add reads it (0 for a zero scale)
};

/// A factor applied as one multiplication (make_factor's usual case), or nullopt.
template <class C>
[[nodiscard]] std::optional<C> single_factor(double ratio) noexcept
{
    const auto factor = make_factor<C>(ratio);
    if (factor.low != C(1) || factor.zero()) return std::nullopt;
    return factor.high;
}

/// The request binary_by_rule makes of two inputs: `natural`, their scales, and the single value
/// of the second where it has one element (the first has many in every use here).
[[nodiscard]] inline scale_request two_input_request(float natural, float first_scale, float second_scale,
                                                     float second_single = std::numeric_limits<float>::quiet_NaN()) noexcept
{
    scale_request request;
    request.natural = natural;
    request.input_scales[0] = first_scale;
    request.input_scales[1] = second_scale;
    request.input_count = 2;
    request.single_values[1] = second_single;
    return request;
}

/// The plan for layer_norm(x) * gain + bias under Strategy, or nullopt where the ops are run one
/// by one: a strategy that needs the amax, gain and bias not 1-D over x's last axis, a
/// one-element x (its single value enters the rules), a zero scale, a factor below float's
/// normal range.
template <class Strategy, class T, class P>
[[nodiscard]] std::optional<affine_norm_plan<compute_t<T>>> plan_affine_norm(const ScaledArray<T, P>& x, const ScaledArray<T, P>& gain,
                                                                             const ScaledArray<T, P>& bias, std::size_t length)
{
    using C = compute_t<T>;
    if constexpr (needs_amax_v<Strategy> || !std::same_as<T, C>) {
        return std::nullopt;
    } else {
        if (gain.dimension() != 1 || bias.dimension() != 1 || gain.size() != length || bias.size() != length || x.size() <= 1 ||
            x.scale() == 0.0f || gain.scale() == 0.0f) {
            return std::nullopt;
        }
        affine_norm_plan<C> plan;
        scale_request normalised;  // normalise_last_axis's request
        normalised.natural = 1.0f;
        normalised.input_scales[0] = x.scale();
        normalised.axis_length = length;
        plan.normalised_scale = checked_output_scale<P>(rule_for<ops::layer_norm, Strategy, P>()(normalised), "layer_norm", normalised);
        const scale_request product = two_input_request(static_cast<float>(double(plan.normalised_scale) * gain.scale()),
                                                        plan.normalised_scale, gain.scale(), single_magnitude(gain));
        if (plan.normalised_scale == 0.0f || product.natural == 0.0f) return std::nullopt;
        plan.product_scale = checked_output_scale<P>(rule_for<ops::mul, Strategy, P>()(product), "mul", product);
        const scale_request sum = two_input_request(std::max(plan.product_scale, bias.scale()), plan.product_scale, bias.scale(),
                                                    single_magnitude(bias));
        if (plan.product_scale == 0.0f || sum.natural == 0.0f) return std::nullopt;
        plan.scale = checked_output_scale<P>(rule_for<ops::add, Strategy, P>()(sum), "add", sum);
        if (plan.scale == 0.0f) return std::nullopt;
        const auto normalised_factor = single_factor<C>(1.0 / double(plan.normalised_scale));
        const auto product_factor = single_factor<C>(double(product.natural) / double(plan.product_scale));
        const auto product_in_sum = single_factor<C>(double(plan.product_scale) / double(sum.natural));
        const auto sum_factor = single_factor<C>(double(sum.natural) / double(plan.scale));
        const auto bias_factor = make_factor<C>(double(bias.scale()) / double(sum.natural));
        if (!normalised_factor || !product_factor || !product_in_sum || !sum_factor || bias_factor.low != C(1)) return std::nullopt;
        plan.normalised_factor = *normalised_factor;
        plan.product_factor = *product_factor;
        plan.product_in_sum = *product_in_sum;
        plan.sum_factor = *sum_factor;
        plan.bias_in_sum.resize(length);
        const T* b = bias.data().data();
        for (std::size_t j = 0; j < length; ++j) plan.bias_in_sum[j] = bias_factor.zero() ? C(0) : load(b[j]) * bias_factor.high;
        return plan;
    }
}

/// layer_norm(x)'s datum i as normalise_last_axis stores it.
template <bool Centred, class T, class P>
[[nodiscard, gnu::always_inline]] inline compute_t<T> normalised_datum(const T* d, const lane_statistics<Centred, T, P>& stats,
                                                                      std::size_t i, std::size_t lane, compute_t<T> factor) noexcept
{
    using C = compute_t<T>;
    return static_cast<C>(normalised_value(d[i], stats.zero_scale, stats.mean[lane], stats.inverse_sigma[lane])) *
           factor;
}

/// layer_norm(x) * gain + bias in one pass from x's lane statistics: each element as the three
/// ops compute it (the normalised datum stored, its product with the gain rounded and
/// rescaled, the bias added at the common scale), stored once.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> affine_normalise(const ScaledArray<T, P>& x, const ScaledArray<T, P>& gain,
                                                 const lane_statistics<true, T, P>& stats, const affine_norm_plan<compute_t<T>>& plan)
{
    using C = compute_t<T>;
    const std::size_t length = gain.size(), lanes = x.size() / length;
    xt::xarray<T> data = xt::xarray<T>::from_shape(x.shape());
    const T* d = x.data().data();
    const T* g = gain.data().data();
    const C* b = plan.bias_in_sum.data();
    T* out = data.data();
    parallel_lanes(lanes, length, [&](std::size_t first, std::size_t last) {
        for (std::size_t lane = first; lane < last; ++lane) {
            const std::size_t base = lane * length;
            for (std::size_t j = 0; j < length; ++j) {
                const C normalised = normalised_datum(d, stats, base + j, lane, plan.normalised_factor);
                const C product = (normalised * load(g[j])) * plan.product_factor;
                out[base + j] = store<T>(plus_fn{}(product * plan.product_in_sum, b[j]) * plan.sum_factor);
            }
        }
    });
    ScaledArray<T, P> result(std::move(data), plan.scale);
    check_output("layer_norm", result);
    return result;
}

/// One lane of affine_normalise_vjp's pass: the normalised cotangent stored, the gain's products
/// and the bias's cotangent added to the running column sums. Its own function with restricted
/// pointers and the factors in registers, so that the compiler vectorises it (in the caller a store
/// could alias the optional factors and the statistics: the loop stayed scalar, 4 % of a step).
template <class T, class C>
[[gnu::always_inline]] inline void affine_normalise_vjp_lane(const T* __restrict g, const T* __restrict x, const T* __restrict gain,
                                                             T* __restrict dn, C* __restrict gain_sums, C* __restrict bias_sums,
                                                             std::size_t length, bool zero_scale, double mean, double inverse_sigma,
                                                             C datum_factor, C normalised_factor, C gain_factor) noexcept
{
    for (std::size_t j = 0; j < length; ++j) {
        const C gj = load(g[j]);
        dn[j] = store<T>((gj * load(gain[j])) * normalised_factor);
        const C normalised = static_cast<C>(normalised_value(x[j], zero_scale, mean, inverse_sigma)) * datum_factor;  // normalised_datum's
        const C product = store<T>((gj * normalised) * gain_factor);
        gain_sums[j] = sum_fn{}(gain_sums[j], product);
        bias_sums[j] = sum_fn{}(bias_sums[j], gj);
    }
}

/// The cotangents of x, gain and bias for y = layer_norm(x) * gain + bias (the fused op) from
/// y's cotangent g: the bits add_vjp, mul_vjp and layer_norm_vjp give one after the other, in
/// one pass over g (the bias's and the gain's sums with the normalised cotangent) and
/// layer_norm_vjp's; the
/// ops one by one where a zero or out-of-range scale takes their special cases.
template <class Strategy, class T, class P>
[[nodiscard]] std::tuple<ScaledArray<T, P>, ScaledArray<T, P>, ScaledArray<T, P>> affine_normalise_vjp(
    const ScaledArray<T, P>& g, const ScaledArray<T, P>& x, const ScaledArray<T, P>& gain, const ScaledArray<T, P>& bias,
    double eps, const lane_statistics<true, T, P>& stats, const affine_norm_plan<compute_t<T>>& plan)
{
    using C = compute_t<T>;
    // layer_norm(x) * gain: the normalised x is mul's first operand, the gain its second.
    using to_normalised_tag = ops::vjp<ops::mul, 0>;
    using to_gain_tag = ops::vjp<ops::mul, 1>;
    const std::size_t length = gain.size(), lanes = x.size() / length;
    using to_bias_tag = ops::vjp<ops::add, 1>;
    // mul_vjp's requests: the normalised cotangent g * gain, the gain's g * normalised summed.
    const scale_request to_normalised =
        two_input_request(static_cast<float>(double(g.scale()) * gain.scale()), g.scale(), gain.scale(), single_magnitude(gain));
    const scale_request to_gain =
        two_input_request(static_cast<float>(double(g.scale()) * plan.normalised_scale), g.scale(), plan.normalised_scale);
    const float normalised_scale = checked_output_scale<P>(rule_for<to_normalised_tag, Strategy, P>()(to_normalised), "mul_vjp", to_normalised);
    const float gain_product_scale = checked_output_scale<P>(rule_for<to_gain_tag, Strategy, P>()(to_gain), "mul_vjp", to_gain);
    const auto normalised_factor = to_normalised.natural == 0.0f || normalised_scale == 0.0f
                                       ? std::nullopt
                                       : single_factor<C>(double(to_normalised.natural) / double(normalised_scale));
    const auto gain_factor = to_gain.natural == 0.0f || gain_product_scale == 0.0f
                                 ? std::nullopt
                                 : single_factor<C>(double(to_gain.natural) / double(gain_product_scale));
    if (!normalised_factor || !gain_factor) {
        ScaledArray<T, P> normalised = normalise_last_axis<ops::layer_norm, true, Strategy, void>("layer_norm", x, eps, stats);
        auto [dn, dgain] = mul_vjp<Strategy>(g, normalised, gain);
        return {normalise_last_axis_vjp<ops::layer_norm, true, Strategy, void>("layer_norm_vjp", dn, x, eps, stats), std::move(dgain),
                unbroadcast<Strategy, to_bias_tag>(g, bias.shape())};
    }
    // One pass in row order (the order of reduce's sum over leading axes): the normalised
    // cotangent stored, the gain's products and the bias's cotangent summed. (A 1-D x has no
    // leading axis: the bias's cotangent is g itself, as unbroadcast gives it.)
    const bool bias_summed = x.dimension() >= 2;
    xt::xarray<T> dn_data = xt::xarray<T>::from_shape(x.shape());
    std::vector<C> gain_sums(length, C(0)), bias_sums(length, C(0));
    for (std::size_t lane = 0; lane < lanes; ++lane) {
        const std::size_t base = lane * length;
        affine_normalise_vjp_lane<T>(g.data().data() + base, x.data().data() + base, gain.data().data(), dn_data.data() + base,
                                     gain_sums.data(), bias_sums.data(), length, stats.zero_scale, stats.mean[lane],
                                     stats.inverse_sigma[lane], plan.normalised_factor, *normalised_factor, *gain_factor);
    }
    // reduce_by_rule's requests: natural the summed array's scale, lanes terms per output.
    const auto summed_request = [lanes](float scale) {
        scale_request summed;
        summed.natural = scale;
        summed.input_scales[0] = scale;
        summed.contraction = std::max<std::size_t>(lanes, 1);
        return summed;
    };
    auto dgain = finish_by_rule<false, P, T, C>("vjp", gain.shape(), summed_request(gain_product_scale),
                                                 rule_for<to_gain_tag, Strategy, P>(), [&gain_sums](std::size_t j) { return gain_sums[j]; });
    auto db = bias_summed ? finish_by_rule<false, P, T, C>("vjp", bias.shape(), summed_request(g.scale()),
                                                           rule_for<to_bias_tag, Strategy, P>(),
                                                           [&bias_sums](std::size_t j) { return bias_sums[j]; })
                          : unbroadcast<Strategy, to_bias_tag>(g, bias.shape());
    auto dx = normalise_last_axis_vjp<ops::layer_norm, true, Strategy, void>(
        "layer_norm_vjp", ScaledArray<T, P>(std::move(dn_data), to_normalised.natural == 0.0f ? 0.0f : normalised_scale), x, eps, stats);
    return {std::move(dx), std::move(dgain), std::move(db)};
}

}  // namespace detail

/// layer_norm(x) * gain + bias as one op (PyTorch's layer_norm with weight and bias; gain and
/// bias of shape (N), N the last axis): one pass and one result array instead of three, each
/// element computed as the three ops compute it, so the same bits and the same scale as the
/// composition under every static strategy. Where the strategy needs the amax, gain or bias are
/// not (N), or a scale is 0, it is the composition.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> layer_norm(const ScaledArray<T, P>& x, const ScaledArray<T, P>& gain, const ScaledArray<T, P>& bias,
                                           double eps = 1e-5)
{
    const std::size_t length = detail::normalised_length("layer_norm", x, eps);
    if (auto plan = detail::plan_affine_norm<Strategy>(x, gain, bias, length)) {
        return detail::affine_normalise(x, gain, detail::lane_statistics<true, T, P>(x, length, eps), *plan);
    }
    return add<Strategy>(mul<Strategy>(layer_norm<Strategy>(x, eps), gain), bias);
}

}  // namespace scalify
