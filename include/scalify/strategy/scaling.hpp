#pragma once
/// \file scaling.hpp
/// How a scaled op picks its output scale. Every op computes its result as raw data times a
/// "natural" scale (for matmul raw = A.B and natural = sa*sb; for add raw = da*sa/m + db*sb/m and
/// natural = m = max(sa, sb); ...). A strategy maps that to the scale the result is stored
/// under; the data become raw * natural / scale. Strategies are types; each op asks
///
///     scaling_traits<ops::matmul, Strategy>::output_scale<Policy>(request)
///
/// whose primary template forwards to Strategy::output_scale<Policy>(ops::matmul{}, request).
/// A user overrides one op's rule by specialising scaling_traits, or adds a strategy by writing a
/// type that satisfies ScalingStrategy. The ops never change.

#include <scalify/config.hpp>
#include <scalify/detail/scoped_setting.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/unit_normal.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <fmt/format.h>
#include <limits>

namespace scalify {

/// Op tags: the first argument of a strategy's rule.
namespace ops {
struct matmul {};
struct add {};
struct sub {};
struct mul {};
struct div {};
struct maximum {};
struct minimum {};
struct neg {};
struct abs {};
struct relu {};
struct gelu {};
struct tanh {};
struct exp {};
struct log {};
struct sqrt {};
struct softmax {};
struct log_softmax {};
struct softmax_cross_entropy {};  ///< the loss; its logits gradient is vjp<softmax_cross_entropy>
struct reduce_sum {};
struct reduce_mean {};
struct reduce_max {};
struct where {};
struct concatenate {};
struct cast {};
struct layout {};  ///< transpose, reshape, slice: data moved, values unchanged
struct layer_norm {};   ///< normalised to zero mean and unit variance along the last axis: natural scale 1
struct rms_norm {};     ///< normalised to unit RMS along the last axis: natural scale 1
struct embedding {};    ///< rows of a table gathered (keeps the table's scale); its vjp scatter-adds
struct causal_mask {};  ///< future positions set to -inf (keeps the scale); its vjp zeroes them

/// The gradient with respect to input `Input` of Op, as its VJP (beside the op in ops/*.hpp) stores it.
/// Gradients have tags of their own so that a strategy, or a specialisation of
/// scaling_traits<ops::vjp<Op, Input>, S>, can give them their own scale. (matmul_vjp's products
/// are matmuls and keep the matmul tag.)
template <class Op, std::size_t Input = 0>
struct vjp {};
}  // namespace ops

/// What a rule may look at.
struct scale_request {
    float natural = 1.0f;         ///< the op's natural scale (see file comment)
    float input_scales[2] = {1.0f, 1.0f};
    std::size_t input_count = 1;
    /// Terms summed into each output: K of a matmul, N of a reduce_sum / reduce_mean, elements of
    /// a gradient summed back over broadcast axes.
    std::size_t contraction = 1;
    std::size_t axis_length = 1;  ///< length of the softmax / log_softmax / normalised axis; classes of a cross-entropy; rows of an embedding table
    std::size_t batch = 1;        ///< rows a loss is averaged over (its gradient carries 1/batch)
    /// |value| of an input that has exactly one element, NaN for the others: such an input is a
    /// known constant, not a sample of unit-scale data (the seed design's scaled_mul reads it too).
    float single_values[2] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::quiet_NaN()};
    /// max |raw| over the result (NaN ignored), filled only for strategies with needs_amax.
    float raw_amax = std::numeric_limits<float>::quiet_NaN();
};

namespace detail {

template <class Op, class... Candidates>
inline constexpr bool is_one_of_v = (std::same_as<Op, Candidates> || ...);

/// The forward op of a gradient tag ops::vjp<Op, I> (void for other tags).
template <class Tag>
struct gradient_of {
    using type = void;
};
template <class Op, std::size_t Input>
struct gradient_of<ops::vjp<Op, Input>> {
    using type = Op;
};
template <class Tag>
using gradient_of_t = typename gradient_of<Tag>::type;

/// Ops whose outputs are sums of `contraction` terms: the seed's sqrt(K) growth applies to them.
template <class Op>
inline constexpr bool sums_terms_v = is_one_of_v<Op, ops::matmul, ops::reduce_sum, ops::reduce_mean> ||
                                     is_one_of_v<gradient_of_t<Op>, ops::add, ops::sub, ops::mul>;

}  // namespace detail

/// The seed design's rules (docs/ops.md): scale follows the inputs, and sums of K terms (matmul,
/// reduce_sum, reduce_mean, a gradient summed over broadcast axes) grow it by sqrt(K) so
/// unit-variance data stays unit variance. Under pow2_scale a rule's result rounds to the nearest
/// power of two.
struct default_scaling {
    static constexpr bool needs_amax = false;
    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op, const scale_request& request) noexcept
    {
        if constexpr (detail::sums_terms_v<Op>) {
            return Policy::from_rule(request.natural * std::sqrt(static_cast<float>(request.contraction)));
        } else {
            return Policy::from_rule(request.natural);
        }
    }
};

/// No rule: every op's result keeps its natural scale (matmul sa*sb, add max(sa, sb), ...). With
/// scale-1 inputs this is plain low-precision arithmetic, the unscaled baseline.
struct natural_scaling {
    static constexpr bool needs_amax = false;
    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op, const scale_request& request) noexcept
    {
        return Policy::from_rule(request.natural);
    }
};

namespace detail {

/// Expected RMS of input i's value when its data are unit-scale: its scale, or |value| for a
/// one-element input (a known constant; a NaN or inf value is not a magnitude).
[[nodiscard]] inline double input_rms(const scale_request& request, std::size_t i) noexcept
{
    const double single = request.single_values[i];
    return std::isfinite(single) ? single : static_cast<double>(request.input_scales[i]);
}

/// unit_scaling's rules: the expected RMS of Op's output value when every input's data are unit
/// normal (N(0, 1), independent) at the request's scales, so that the data come out at unit RMS.
/// Positive-domain ops (log, sqrt) take log-normal data e^z instead: half-normal data would give
/// their gradients infinite variance (E[1/z^2] = inf), so no static rule could exist. NaN: the
/// op has no rule of its own and keeps its natural scale (neg, abs, where, maximum, minimum,
/// reduce_max, casts and layout ops already keep unit data unit; div has no unit-normal rule).
/// Derivations and measured RMS: docs/ops.md, "unit_scaling's rules".
template <class Op>
[[nodiscard]] double unit_normal_rms(Op, const scale_request& request) noexcept
{
    namespace un = unit_normal;
    using forward = gradient_of_t<Op>;
    const double natural = request.natural;
    const double s0 = request.input_scales[0], s1 = request.input_scales[1];
    const double terms = static_cast<double>(request.contraction);
    const double length = static_cast<double>(request.axis_length);
    constexpr double e = 2.71828182845904523536;
    if constexpr (sums_terms_v<Op> || is_one_of_v<Op, ops::mul, ops::vjp<ops::exp>, ops::vjp<ops::reduce_mean>>) {
        // A sum of `terms` products of independent unit data has RMS sqrt(terms) (matmul's K, a
        // sum's N; a mean's 1/N is in the natural scale). A one-element factor scales the product
        // by its |value| rather than by a unit-scale sample. (matmul's request names no
        // one-element input, so its rule is the seed's natural * sqrt(K), unchanged.)
        double rms = natural * std::sqrt(terms);
        for (std::size_t i = 0; i < request.input_count && i < 2; ++i) {
            if (std::isfinite(request.single_values[i])) rms *= input_rms(request, i) / request.input_scales[i];
        }
        return rms;
    } else if constexpr (is_one_of_v<Op, ops::add, ops::sub>) {
        // Independent terms: variances add. A one-element operand adds its value squared
        // (unit-scaling leaves that case unscaled; here it is exact).
        const double a = input_rms(request, 0), b = input_rms(request, 1);
        return std::sqrt(a * a + b * b);
    } else if constexpr (std::same_as<Op, ops::relu>) {
        return un::relu_rms(s0);  // E[relu(x)^2] = s^2 / 2
    } else if constexpr (std::same_as<Op, ops::gelu>) {
        return un::gelu_rms(s0);  // quadrature; s = 1: 0.652 (RMS; 0.588 is its standard deviation)
    } else if constexpr (std::same_as<Op, ops::tanh>) {
        return un::tanh_rms(s0);  // quadrature; s = 1: 0.628
    } else if constexpr (std::same_as<Op, ops::exp>) {
        return un::exp_rms(s0);  // E[e^(2x)] = e^(2 s^2)
    } else if constexpr (std::same_as<Op, ops::log>) {
        return std::sqrt(std::log(s0) * std::log(s0) + 1.0);  // log(s e^z) = log s + z
    } else if constexpr (std::same_as<Op, ops::sqrt>) {
        return std::sqrt(s0) * std::exp(0.25);  // E[s e^z] = s e^(1/2)
    } else if constexpr (std::same_as<Op, ops::softmax>) {
        return std::sqrt(un::softmax_sum_squares(length, s0) / length);  // exact E[sum p^2], see unit_normal.hpp
    } else if constexpr (std::same_as<Op, ops::log_softmax>) {
        return un::log_softmax_rms(length, s0);
    } else if constexpr (std::same_as<Op, ops::concatenate>) {
        return s0;  // the parts' scales combined as an RMS weighted by their sizes (shape.hpp)
    } else if constexpr (is_one_of_v<Op, ops::layer_norm, ops::rms_norm>) {
        return natural;  // unit variance (RMS) by construction, whatever the input's scale
    } else if constexpr (std::same_as<forward, ops::layer_norm>) {
        // (g - mean g - y mean(g y)) / sigma at the natural scale s_g / s_x: g projected off the
        // two directions 1 and y of an N-long lane keeps (N - 2) / N of its variance.
        return natural * std::sqrt(std::max(length - 2.0, 1.0) / length);
    } else if constexpr (std::same_as<forward, ops::rms_norm>) {
        return natural * std::sqrt(std::max(length - 1.0, 1.0) / length);  // off the one direction y
    } else if constexpr (std::same_as<forward, ops::embedding>) {
        // `terms` unit rows scatter-added into a table of `length` rows: the table's RMS is
        // sqrt(terms / length) whatever the ids (sums of independent rows add variances).
        return natural * std::sqrt(terms / length);
    } else if constexpr (std::same_as<forward, ops::relu>) {
        return s0 * un::inv_sqrt2;  // g [x > 0]: half the entries pass
    } else if constexpr (std::same_as<forward, ops::gelu>) {
        return s0 * un::gelu_grad_rms(s1);  // g gelu'(x), x at scale s1; s1 = 1: 0.675
    } else if constexpr (std::same_as<forward, ops::tanh>) {
        return s0 * un::tanh_grad_rms(s1);  // g (1 - tanh(x)^2); s1 = 1: 0.682
    } else if constexpr (std::same_as<forward, ops::log>) {
        return s0 * e / s1;  // g / x, x = s1 e^z: E[e^(-2z)] = e^2
    } else if constexpr (std::same_as<forward, ops::sqrt>) {
        // g / (2y), s1 the scale of 2y: y = sqrt(s e^z) stored at unit RMS has data e^(z/2 - 1/4),
        // and E[e^(-z + 1/2)] = e.
        return s0 * std::sqrt(e) / s1;
    } else if constexpr (std::same_as<forward, ops::softmax>) {
        // y (g - sum g y) with y stored at unit RMS (scale s1): taking y as m-hot with
        // m = 1 / (L s1^2), E[(y (g - sum g y))^2] = s0^2 s1^2 (1 - sum y^2) exactly. Measured
        // at unit-normal logits: data RMS 0.88 (L = 8) to 1.00 (L >= 1024).
        const double flat = 1.0 - length * s1 * s1;
        return s0 * s1 * std::sqrt(std::max(flat, 1.0 / (length * length)));
    } else if constexpr (std::same_as<forward, ops::log_softmax>) {
        // g - softmax sum g: E = s0^2 (1 - 2/L + E[sum p^2]), between s0^2 (1 - 1/L) (flat) and
        // 2 s0^2 (1 - 1/L) (one-hot); y does not tell where, so E[sum p^2] is taken as 2/L:
        // s0 itself (measured 0.99 of the true RMS at unit-normal logits, L = 8; 1.00 from 64).
        return s0;
    } else if constexpr (std::same_as<forward, ops::softmax_cross_entropy>) {
        // (p - onehot) / batch with labels independent of the logits (scale s0):
        // E[sum_c (p_c - d_c)^2] = E[sum p^2] - 2/C + 1 over C entries per row.
        const double per_row = un::softmax_sum_squares(length, s0) - 2.0 / length + 1.0;
        return std::sqrt(std::max(per_row, 0.0) / length) / static_cast<double>(request.batch);
    } else {
        return std::numeric_limits<double>::quiet_NaN();
    }
}

}  // namespace detail

/// Unit scaling (Blake et al. 2023), stateless and value-preserving: every op's output scale is
/// the expected RMS of its value for unit-normal input data at the input scales
/// (detail::unit_normal_rms), so data stay near unit RMS through deep chains, forward and
/// backward, and each gradient gets its own ideal scale (no constraint is needed: the scale never
/// changes a value). Ops without a rule of their own, and degenerate inputs (a zero scale, a rule
/// that over/underflows float32), keep default_scaling's scale.
struct unit_scaling {
    static constexpr bool needs_amax = false;
    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op op, const scale_request& request) noexcept
    {
        const double rms = detail::unit_normal_rms(op, request);
        if (rms > 0.0 && rms <= static_cast<double>(std::numeric_limits<float>::max()) && static_cast<float>(rms) > 0.0f) {
            return Policy::from_rule(static_cast<float>(rms));
        }
        return default_scaling::output_scale<Policy>(op, request);
    }
};

/// Dynamic amax scaling: after computing the raw result, pick the scale that maps its amax to
/// max(Target) / 2^Margin, so the data fill Target's range. Under pow2_scale the scale rounds up
/// (data never exceed the target; TransformerEngine's "scale", our inverse, rounds down). An
/// all-zero or non-finite amax keeps the natural scale.
template <ScaledElement Target, int Margin = 0>
struct dynamic_abs {
    static_assert(Margin >= 0 && Margin < 64, "dynamic_abs: Margin is a number of binades, 0..63");
    static constexpr bool needs_amax = true;
    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op, const scale_request& request) noexcept
    {
        const double target = static_cast<double>(std::numeric_limits<Target>::max()) / std::ldexp(1.0, Margin);
        const double wanted = static_cast<double>(request.raw_amax) * request.natural / target;
        if (!(request.raw_amax > 0.0f) || !std::isfinite(request.raw_amax) || !(wanted > 0.0) ||
            !(wanted < static_cast<double>(std::numeric_limits<float>::max()))) {
            return Policy::from_rule(request.natural);
        }
        const auto scale = static_cast<float>(wanted);
        if constexpr (Policy::power_of_two) return pow2_round_up(scale);
        else return scale;
    }
};

/// The one place ops ask for a scale. Specialise for (Op, Strategy) to change one rule.
template <class Op, class Strategy>
struct scaling_traits {
    template <ScalePolicy Policy>
    [[nodiscard]] static float output_scale(const scale_request& request)
    {
        return Strategy::template output_scale<Policy>(Op{}, request);
    }
};

/// A strategy: says whether it needs the raw amax, and gives a scale for (at least) every op tag
/// through scaling_traits.
template <class S>
concept ScalingStrategy = requires(const scale_request& request) {
    { S::needs_amax } -> std::convertible_to<bool>;
    { scaling_traits<ops::matmul, S>::template output_scale<float_scale>(request) } -> std::same_as<float>;
    { scaling_traits<ops::add, S>::template output_scale<pow2_scale>(request) } -> std::same_as<float>;
};

/// Whether runtime_scaling may list S: a strategy whose `changes_ops` says it changes ops beyond
/// their scales may be listed only if its `runtime_dispatch` says that those ops check the list's
/// choice at run time (else the list would silently run them as the other strategies' ops).
template <class S>
inline constexpr bool runtime_listable = !requires { S::changes_ops; } || requires { S::runtime_dispatch; };

namespace detail {
/// The index of the strategy runtime_scaling list `Choice` runs on this thread.
template <class Choice>
[[nodiscard]] std::size_t& runtime_scaling_slot() noexcept
{
    thread_local std::size_t index = 0;
    return index;
}
}  // namespace detail

/// Rules chosen at run time among Strategies. A model's code is compiled once per strategy its
/// vars name (forward, backward rules and all): a program that offers several strategies (a
/// --mode flag) names this one instead and compiles the model once. Each op then asks the thread's
/// choice for its scale, one indexed call through scaling_traits<Op, S> (so a specialised rule
/// still applies); no op body depends on the strategy. The choice is the innermost
/// runtime_scaling::scope on this thread (as matmul_precision_scope and accumulation_scope<>), the
/// first strategy outside any. With a strategy that needs the raw amax every op computes it,
/// whichever is chosen. A strategy that changes more than its ops' scales is listed only where
/// the ops it changes look the choice up at run time (runtime_listable): autoscale::autoscaled,
/// whose vars' matmuls run as layers while it is the choice and as the list's matmuls otherwise.
///
///     using rules = runtime_scaling<unit_scaling, natural_scaling>;
///     const rules::scope chosen(unit_scaled ? rules::index_of<unit_scaling> : rules::index_of<natural_scaling>);
///     auto [loss, grads] = ad::value_and_grad<rules>(model, params);
template <ScalingStrategy... Strategies>
    requires(sizeof...(Strategies) > 0)
struct runtime_scaling {
    static_assert((runtime_listable<Strategies> && ...),
                  "runtime_scaling: a listed strategy changes ops beyond their scales and those ops do not look "
                  "the list's choice up at run time; name it directly");
    static constexpr bool needs_amax = (bool(Strategies::needs_amax) || ...);
    static constexpr std::size_t size = sizeof...(Strategies);
    /// The position of S in the list.
    template <class S>
        requires(std::same_as<S, Strategies> || ...)
    static constexpr std::size_t index_of = [] {
        std::size_t i = 0;
        static_cast<void>(((std::same_as<S, Strategies> ? true : (++i, false)) || ...));
        return i;
    }();

    /// The index of the strategy this thread runs.
    [[nodiscard]] static std::size_t current() noexcept { return detail::runtime_scaling_slot<runtime_scaling>(); }

    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op, const scale_request& request)
    {
        const std::size_t chosen = current();
        float scale = 0.0f;
        std::size_t i = 0;
        static_cast<void>(
            ((i++ == chosen ? (scale = scaling_traits<Op, Strategies>::template output_scale<Policy>(request), true) : false) ||
             ...));
        return scale;
    }

    /// Runs the strategy at `index` (index_of<S>) on this thread for the scope's lifetime, the
    /// previous choice restored on destruction; config_error for an index past the list.
    class scope {
    public:
        explicit scope(std::size_t index) : m_index(detail::runtime_scaling_slot<runtime_scaling>(), checked(index)) {}

    private:
        [[nodiscard]] static std::size_t checked(std::size_t index)
        {
            if (index >= size) {
                SCALIFY_THROW(config_error(
                    fmt::format("runtime_scaling::scope: strategy index {} is past the list of {}", index, size)));
            }
            return index;
        }
        detail::scoped_setting<std::size_t> m_index;
    };
};

}  // namespace scalify
