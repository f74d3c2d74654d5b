#pragma once
/// \file normalization.hpp
/// layer_norm and rms_norm along the last axis (no affine part: a model multiplies by its gain
/// and adds its bias with mul and add), and their backward rules.
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
#include <scalify/ops/result.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/scaling.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
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
        return bit_select(zero, C(0), static_cast<C>((double(load(d[i])) - mean[lane]) * inverse_sigma[lane]));
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

/// The gradient from x's lane statistics (those its forward pass computed: the same values).
template <class Op, bool Centred, class Strategy, class Out, class G, class PG, class T, class P>
[[nodiscard]] auto normalise_last_axis_vjp(const char* op, const ScaledArray<G, PG>& g, const ScaledArray<T, P>& x, double eps,
                                           const lane_statistics<Centred, T, P>& stats)
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
        return bit_select(zero, 0.0, (double(load(d[i])) - mean[lane]) * inverse_sigma[lane]);
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

}  // namespace scalify
