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

#include <scalify/numeric/limits.hpp>
#include <scalify/scaled_array.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
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
struct exp {};
struct log {};
struct sqrt {};
struct softmax {};
struct reduce_sum {};
struct reduce_max {};
struct where {};
struct concatenate {};
struct cast {};
struct layout {};  ///< transpose, reshape, slice: data moved, values unchanged
}  // namespace ops

/// What a rule may look at.
struct scale_request {
    float natural = 1.0f;         ///< the op's natural scale (see file comment)
    float input_scales[2] = {1.0f, 1.0f};
    std::size_t input_count = 1;
    std::size_t contraction = 1;  ///< K of a matmul, elements per output of a reduce_sum
    /// max |raw| over the result (NaN ignored), filled only for strategies with needs_amax.
    float raw_amax = std::numeric_limits<float>::quiet_NaN();
};

/// The seed design's rules (docs/ops.md): scale follows the inputs, and contractions over K terms
/// grow it by sqrt(K) so unit-variance data stays unit variance. Under pow2_scale a rule's result
/// rounds to the nearest power of two.
struct default_scaling {
    static constexpr bool needs_amax = false;
    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op, const scale_request& request) noexcept
    {
        if constexpr (std::same_as<Op, ops::matmul> || std::same_as<Op, ops::reduce_sum>) {
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

/// Unit scaling (Blake et al. 2023): as default_scaling, but a sum of two independent unit-variance
/// terms has scale sqrt(sa^2 + sb^2), so add and sub keep unit variance too.
struct unit_scaling {
    static constexpr bool needs_amax = false;
    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op op, const scale_request& request) noexcept
    {
        if constexpr (std::same_as<Op, ops::add> || std::same_as<Op, ops::sub>) {
            const double a = request.input_scales[0], b = request.input_scales[1];
            return Policy::from_rule(static_cast<float>(std::sqrt(a * a + b * b)));
        } else {
            return default_scaling::output_scale<Policy>(op, request);
        }
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

}  // namespace scalify
