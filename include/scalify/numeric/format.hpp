#pragma once
/// \file format.hpp
/// The format descriptor: one type describes every small float (CUTLASS exmy style), from which
/// minifloat<Format>, its conversions and its limits are all derived.

#include <concepts>
#include <cstdint>
#include <type_traits>

namespace scalify {

/// Which codes a format spends on non-finite values (names follow ml_dtypes' suffixes).
enum class special_values {
    ieee,               ///< all-ones exponent: zero mantissa is +-inf, any other is NaN (e5m2, e4m3, e3m4)
    nan_all_ones,       ///< "fn": no inf; only the all-ones magnitude is NaN (e4m3fn, e8m0fnu)
    nan_negative_zero,  ///< "fnuz": no inf, no -0; the code 1000...0 is the single NaN (e4m3fnuz, ...)
    none                ///< finite only: no inf, no NaN (e2m3fn, e3m2fn, e2m1fn)
};

/// A binary floating-point format of at most 16 bits.
/// \tparam HasZero false for exponent-only scale formats (e8m0fnu), whose exponent field 0 is
///         a normal binade: no zero and no subnormals.
template <int ExponentBits, int MantissaBits, int Bias, special_values Specials, bool IsSigned = true,
          bool HasZero = true>
struct float_format {
    static_assert(ExponentBits >= 1 && MantissaBits >= 0 && MantissaBits <= 10,
                  "float_format supports 1+ exponent bits and at most 10 mantissa bits");
    static_assert(ExponentBits + MantissaBits + (IsSigned ? 1 : 0) <= 16,
                  "float_format describes formats of at most 16 bits");
    static_assert(IsSigned || Specials != special_values::none,
                  "an unsigned format needs a NaN to map negative inputs to");
    static_assert(HasZero || MantissaBits == 0,
                  "only exponent-only formats (E8M0 style) may lack a zero");
    static_assert(Specials != special_values::nan_negative_zero || IsSigned,
                  "the 'fnuz' NaN lives in the sign bit, so the format must be signed");

    static constexpr int exponent_bits = ExponentBits;
    static constexpr int mantissa_bits = MantissaBits;
    static constexpr int bias = Bias;
    static constexpr special_values specials = Specials;
    static constexpr bool is_signed = IsSigned;
    static constexpr bool has_zero = HasZero;

    static constexpr int magnitude_bits = ExponentBits + MantissaBits;
    static constexpr int total_bits = magnitude_bits + (IsSigned ? 1 : 0);
    using storage_type = std::conditional_t<(total_bits <= 8), std::uint8_t, std::uint16_t>;

    static constexpr bool has_infinity = Specials == special_values::ieee;
    static constexpr bool has_nan = Specials != special_values::none;

    static constexpr unsigned magnitude_mask = (1u << magnitude_bits) - 1u;
    static constexpr unsigned sign_mask = IsSigned ? (1u << magnitude_bits) : 0u;
    static constexpr unsigned mantissa_mask = (1u << MantissaBits) - 1u;
    /// Magnitude code of +inf (ieee formats only).
    static constexpr unsigned infinity_magnitude = ((1u << ExponentBits) - 1u) << MantissaBits;
    /// Largest finite magnitude code.
    static constexpr unsigned max_magnitude = Specials == special_values::ieee           ? infinity_magnitude - 1u
                                              : Specials == special_values::nan_all_ones ? magnitude_mask - 1u
                                                                                         : magnitude_mask;
    /// Exponent field of the smallest normal binade.
    static constexpr int min_normal_field = HasZero ? 1 : 0;
    /// The NaN this library produces for a positive NaN input (the sign is kept where the format can).
    static constexpr unsigned canonical_nan = Specials == special_values::nan_negative_zero ? sign_mask
                                                                                           : magnitude_mask;
};

/// A type that describes a float format the way float_format does.
template <class F>
concept FloatFormat = requires {
    { F::exponent_bits } -> std::convertible_to<int>;
    { F::mantissa_bits } -> std::convertible_to<int>;
    { F::bias } -> std::convertible_to<int>;
    { F::specials } -> std::convertible_to<special_values>;
    { F::is_signed } -> std::convertible_to<bool>;
    { F::has_zero } -> std::convertible_to<bool>;
    typename F::storage_type;
} && std::is_base_of_v<float_format<F::exponent_bits, F::mantissa_bits, F::bias, F::specials, F::is_signed, F::has_zero>, F>;

/// The formats of ml_dtypes, by its names. Each is a distinct type so that diagnostics stay short.
namespace formats {
struct e4m3fn : float_format<4, 3, 7, special_values::nan_all_ones> {};
struct e5m2 : float_format<5, 2, 15, special_values::ieee> {};
struct e4m3fnuz : float_format<4, 3, 8, special_values::nan_negative_zero> {};
struct e5m2fnuz : float_format<5, 2, 16, special_values::nan_negative_zero> {};
struct e4m3b11fnuz : float_format<4, 3, 11, special_values::nan_negative_zero> {};
struct e3m4 : float_format<3, 4, 3, special_values::ieee> {};
struct e4m3 : float_format<4, 3, 7, special_values::ieee> {};
struct e8m0fnu : float_format<8, 0, 127, special_values::nan_all_ones, false, false> {};
struct e2m3fn : float_format<2, 3, 1, special_values::none> {};
struct e3m2fn : float_format<3, 2, 3, special_values::none> {};
struct e2m1fn : float_format<2, 1, 1, special_values::none> {};
/// IEEE binary16 and bfloat16: used to round into Eigen::half / Eigen::bfloat16 with any policy.
struct binary16 : float_format<5, 10, 15, special_values::ieee> {};
struct bfloat16 : float_format<8, 7, 127, special_values::ieee> {};
}  // namespace formats

}  // namespace scalify
