#pragma once
/// \file policies.hpp
/// Rounding and saturation policies: tag types with inline constexpr objects, closed by concepts.
/// Internally each maps to an enum so the conversion engine is instantiated per mode, not per tag.

#include <concepts>
#include <type_traits>

namespace scalify {

enum class rounding_mode { nearest_even, toward_zero, stochastic };
enum class saturation_mode { none, finite };

/// Round to nearest, ties to even (IEEE 754 default, ml_dtypes, H100 cvt.rn).
struct round_nearest_even {
    static constexpr rounding_mode mode = rounding_mode::nearest_even;
};
/// Truncate the magnitude. Overflow then follows the saturation policy (see docs/formats.md).
struct round_toward_zero {
    static constexpr rounding_mode mode = rounding_mode::toward_zero;
};
/// Round up with probability equal to the distance from the lower neighbour, in units of its
/// spacing, using 32 random bits: unbiased in expectation (bias below 2^-32 ulp).
struct round_stochastic {
    static constexpr rounding_mode mode = rounding_mode::stochastic;
};

/// Overflow (and +-inf) become inf where the format has one, else NaN; finite-only formats saturate.
struct no_saturation {
    static constexpr saturation_mode mode = saturation_mode::none;
};
/// Finite overflow and +-inf clamp to +-max (H100 cvt.satfinite); NaN stays NaN.
struct saturate_finite {
    static constexpr saturation_mode mode = saturation_mode::finite;
};

inline constexpr round_nearest_even round_nearest_even_v{};
inline constexpr round_toward_zero round_toward_zero_v{};
inline constexpr round_stochastic round_stochastic_v{};
inline constexpr no_saturation no_saturation_v{};
inline constexpr saturate_finite saturate_finite_v{};

/// One of the rounding policy tags above (closed set: the engine implements exactly these).
template <class T>
concept RoundingPolicy = std::same_as<T, round_nearest_even> || std::same_as<T, round_toward_zero> ||
                         std::same_as<T, round_stochastic>;

/// One of the saturation policy tags above.
template <class T>
concept SaturationPolicy = std::same_as<T, no_saturation> || std::same_as<T, saturate_finite>;

/// A rounding policy that needs random bits.
template <class T>
concept StochasticRounding = RoundingPolicy<T> && T::mode == rounding_mode::stochastic;

/// A rounding policy whose result depends on the input alone.
template <class T>
concept DeterministicRounding = RoundingPolicy<T> && !StochasticRounding<T>;

}  // namespace scalify
