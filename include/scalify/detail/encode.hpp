#pragma once
/// \file encode.hpp
/// The one conversion engine: IEEE binary32/64 -> any float_format, for every rounding and
/// saturation mode. Integer arithmetic only (no dependence on the FP environment) and free of
/// branches that the compiler cannot turn into selects, so bulk loops over it vectorise.

#include <scalify/detail/float_bits.hpp>
#include <scalify/numeric/format.hpp>
#include <scalify/numeric/policies.hpp>

#include <bit>
#include <concepts>
#include <cstdint>

namespace scalify::detail {

/// Rounded magnitude (exponent field and mantissa, no sign) of |x| in Format, before any overflow
/// handling: may exceed Format::max_magnitude. The general path, for every source and format.
template <FloatFormat Format, rounding_mode Rounding, class Source>
[[nodiscard]] constexpr int rounded_magnitude(Source x, std::uint32_t random_bits) noexcept
{
    using src = ieee_layout<Source>;
    using uint = typename src::uint;
    constexpr int mantissa_bits = Format::mantissa_bits;

    const uint abs_bits = std::bit_cast<uint>(x) & src::abs_mask;
    const int src_field = static_cast<int>(abs_bits >> src::mantissa_bits);

    // Significand with its implicit bit; source subnormals have effective exponent field 1.
    const uint significand = (abs_bits & src::mantissa_mask) | (src_field != 0 ? src::implicit_bit : uint{0});
    const int field = (src_field != 0 ? src_field : 1) - src::bias + Format::bias;  // target exponent field
    const int deficit = Format::min_normal_field - field;  // > 0: below the target's normal range
    // Bits of the significand below the target's last place; more for target subnormals.
    const int drop = src::mantissa_bits - mantissa_bits + (deficit > 0 ? deficit : 0);
    const int drop_clamped = drop < src::total_bits - 1 ? drop : src::total_bits - 1;

    uint kept = significand >> drop_clamped;
    const uint rest = significand & ((uint{1} << drop_clamped) - 1);
    if constexpr (Rounding == rounding_mode::nearest_even) {
        const uint half = uint{1} << (drop_clamped - 1);
        kept += (rest > half || (rest == half && (kept & 1) != 0)) ? 1 : 0;
    } else if constexpr (Rounding == rounding_mode::stochastic) {
        // The discarded fraction of an ulp as a 32-bit fixed-point number: exact while drop <= 32,
        // truncated (error < 2^-32) for inputs far below the smallest subnormal.
        const int left = drop <= 32 ? 32 - drop : 0;
        const int right_wanted = drop > 32 ? drop - 32 : 0;
        const int right = right_wanted < src::total_bits - 1 ? right_wanted : src::total_bits - 1;
        const auto fraction = static_cast<std::uint32_t>((rest << left) >> right);
        kept += random_bits < fraction ? 1 : 0;
    }

    // kept carries the implicit bit for normals, so adding it to the field below lets a
    // rounding carry move into the next binade (and a subnormal into the smallest normal).
    const int base_field = (deficit > 0 ? Format::min_normal_field : field) - 1;
    const int magnitude = base_field * (1 << mantissa_bits) + static_cast<int>(kept);
    return magnitude > 0 ? magnitude : 0;  // formats without zero: round up to the smallest value
}

/// The same for a float source, deterministic rounding and a signed format with a zero, in
/// fewer operations: in the target's normal range the float's own bits round in place
/// (add half an ulp minus one plus the parity bit, then shift), so a carry moves into the
/// exponent by itself; below it, the significand shifts by a per-element amount. Both paths
/// are computed and one selected, which keeps bulk loops vectorised (about twice the general
/// path's throughput).
template <FloatFormat Format, rounding_mode Rounding>
[[nodiscard]] constexpr int rounded_magnitude_fast(float x) noexcept
{
    constexpr int drop = 23 - Format::mantissa_bits;
    constexpr int target_min_normal_field = 127 - Format::bias + Format::min_normal_field;  // as a float field
    constexpr std::uint32_t min_normal_bits = static_cast<std::uint32_t>(target_min_normal_field) << 23;
    const std::uint32_t abs_bits = std::bit_cast<std::uint32_t>(x) & 0x7fffffffu;

    std::uint32_t normal = abs_bits;
    if constexpr (Rounding == rounding_mode::nearest_even) normal += ((1u << (drop - 1)) - 1) + ((abs_bits >> drop) & 1u);
    const int normal_magnitude = static_cast<int>(normal >> drop) - ((127 - Format::bias) << Format::mantissa_bits);

    // Float subnormals need their own significand and field unless every one rounds to zero
    // anyway (so for every 8-bit format and binary16, but not bfloat16).
    constexpr bool float_subnormals_round_to_zero = drop + target_min_normal_field >= 25;
    int src_field = static_cast<int>(abs_bits >> 23);
    std::uint32_t significand = (abs_bits & 0x7fffffu) | 0x800000u;
    if constexpr (!float_subnormals_round_to_zero) {
        significand = src_field != 0 ? significand : abs_bits;
        src_field = src_field != 0 ? src_field : 1;
    }
    // Only shifts > drop are ever selected; larger inputs (shift <= 0) must still shift by a
    // defined amount: as unsigned they wrap around and clamp to 31 with the too-large ones.
    const unsigned shift_less_one = static_cast<unsigned>(drop - 1 + target_min_normal_field - src_field);
    const unsigned shift = (shift_less_one < 30u ? shift_less_one : 30u) + 1u;
    std::uint32_t subnormal = significand;
    if constexpr (Rounding == rounding_mode::nearest_even) subnormal += ((1u << (shift - 1)) - 1) + ((significand >> shift) & 1u);
    const int subnormal_magnitude = static_cast<int>(subnormal >> shift);

    return magnitude_less(abs_bits, min_normal_bits) ? subnormal_magnitude : normal_magnitude;
}

template <FloatFormat Format, rounding_mode Rounding, class Source>
inline constexpr bool has_fast_path = std::same_as<Source, float> && Rounding != rounding_mode::stochastic &&
                                      Format::is_signed && Format::has_zero && Format::mantissa_bits <= 22;

template <FloatFormat Format, rounding_mode Rounding, saturation_mode Saturation, class Source>
[[nodiscard]] constexpr typename Format::storage_type encode(Source x, std::uint32_t random_bits = 0) noexcept
{
    using src = ieee_layout<Source>;
    using uint = typename src::uint;
    using storage = typename Format::storage_type;

    const uint bits = std::bit_cast<uint>(x);
    const bool negative = (bits >> (src::total_bits - 1)) != 0;
    const uint abs_bits = bits & src::abs_mask;
    const bool is_nan = magnitude_less(uint{src::infinity_bits}, abs_bits);
    int magnitude = 0;
    if constexpr (has_fast_path<Format, Rounding, Source>) {
        magnitude = rounded_magnitude_fast<Format, Rounding>(x);
    } else {
        magnitude = rounded_magnitude<Format, Rounding>(x, random_bits);
    }

    const bool overflow = magnitude > static_cast<int>(Format::max_magnitude);
    const unsigned sign = negative ? Format::sign_mask : 0u;
    constexpr bool saturates = Saturation == saturation_mode::finite || !Format::has_nan;

    unsigned code = sign | static_cast<unsigned>(magnitude);
    if constexpr (saturates) {
        // A clamp rather than a select on `overflow`: GCC keeps this form vectorised.
        constexpr int max_magnitude = static_cast<int>(Format::max_magnitude);
        code = sign | static_cast<unsigned>(magnitude < max_magnitude ? magnitude : max_magnitude);
    } else if constexpr (Format::has_infinity) {
        code = overflow ? (sign | Format::infinity_magnitude) : code;
    } else if constexpr (Format::specials == special_values::nan_negative_zero) {
        code = overflow ? Format::canonical_nan : code;
    } else {
        code = overflow ? (sign | Format::canonical_nan) : code;
    }
    if constexpr (Format::specials == special_values::nan_negative_zero) {
        code = magnitude == 0 ? 0u : code;  // no negative zero
    }

    // NaN input: the format's NaN with the input's sign where it has one; zero where it has none.
    unsigned nan_code = sign;
    if constexpr (Format::specials == special_values::nan_negative_zero) {
        nan_code = Format::canonical_nan;
    } else if constexpr (Format::has_nan) {
        nan_code = sign | Format::canonical_nan;
    }
    code = is_nan ? nan_code : code;

    if constexpr (!Format::is_signed) {
        code = negative ? Format::canonical_nan : code;  // negative values (and -0) have no code
    }
    if constexpr (!Format::has_zero) {
        code = abs_bits == 0 ? Format::canonical_nan : code;  // as ml_dtypes: zero has no code
    }
    return static_cast<storage>(code);
}

/// Exact float value of a code (every format of at most 16 bits with <= 10 mantissa bits fits).
/// NaN codes give a quiet NaN with the code's sign bit.
template <FloatFormat Format>
[[nodiscard]] constexpr float decode(unsigned code) noexcept
{
    constexpr int mantissa_bits = Format::mantissa_bits;
    constexpr std::uint32_t float_nan = 0x7fc00000u;
    constexpr std::uint32_t float_infinity = 0x7f800000u;
    const std::uint32_t sign = (code & Format::sign_mask) != 0 ? 0x80000000u : 0u;
    const unsigned magnitude = code & Format::magnitude_mask;

    std::uint32_t abs_bits = 0;
    const int field = static_cast<int>(magnitude >> mantissa_bits);
    const unsigned mantissa = magnitude & Format::mantissa_mask;
    if (Format::has_zero && field == 0) {
        abs_bits = std::bit_cast<std::uint32_t>(exact_float(mantissa, 1 - Format::bias - mantissa_bits));
    } else {
        abs_bits = std::bit_cast<std::uint32_t>(
            exact_float((1u << mantissa_bits) | mantissa, field - Format::bias - mantissa_bits));
    }
    if constexpr (Format::specials == special_values::nan_negative_zero) {
        abs_bits = code == Format::canonical_nan ? float_nan : abs_bits;
    } else if constexpr (Format::specials == special_values::nan_all_ones) {
        abs_bits = magnitude == Format::magnitude_mask ? float_nan : abs_bits;
    } else if constexpr (Format::specials == special_values::ieee) {
        abs_bits = magnitude == Format::infinity_magnitude ? float_infinity
                   : magnitude > Format::infinity_magnitude ? float_nan
                                                            : abs_bits;
    }
    return std::bit_cast<float>(sign | abs_bits);
}

/// decode() without branches or table, for bulk loops that the compiler should vectorise
/// (fake quantisation). Formats with a zero only; every value, subnormals included, is a normal
/// float32, so the one multiplication is exact and immune to FTZ/DAZ.
template <FloatFormat Format>
[[nodiscard]] constexpr float decode_branchless(unsigned code) noexcept
{
    static_assert(Format::has_zero && Format::bias - 1 + Format::mantissa_bits < 126,
                  "decode_branchless needs a format whose subnormals are normal float32 values");
    constexpr int mantissa_bits = Format::mantissa_bits;
    const std::uint32_t sign = (code & Format::sign_mask) != 0 ? 0x80000000u : 0u;
    const unsigned magnitude = code & Format::magnitude_mask;
    const unsigned field = magnitude >> mantissa_bits;
    const unsigned mantissa = magnitude & Format::mantissa_mask;
    const std::uint32_t normal = ((field + 127u - static_cast<unsigned>(Format::bias)) << 23) | (mantissa << (23 - mantissa_bits));
    // mantissa * 2^(1 - bias - M), normalised in integers: its leading bit position by M compares.
    // (An int->float conversion or FP multiply would keep GCC from if-converting the loop.)
    unsigned top = 0;
    for (int bit = 1; bit < mantissa_bits; ++bit) top += mantissa >= (1u << bit) ? 1u : 0u;
    const std::uint32_t subnormal =
        mantissa == 0 ? 0u
                      : ((top + 128u - static_cast<unsigned>(Format::bias + mantissa_bits)) << 23) |
                            ((mantissa << (23 - top)) & 0x7fffffu);
    std::uint32_t abs_bits = field == 0 ? subnormal : normal;
    if constexpr (Format::specials == special_values::nan_negative_zero) {
        abs_bits = code == Format::canonical_nan ? 0x7fc00000u : abs_bits;
    } else if constexpr (Format::specials == special_values::nan_all_ones) {
        abs_bits = magnitude == Format::magnitude_mask ? 0x7fc00000u : abs_bits;
    } else if constexpr (Format::specials == special_values::ieee) {
        abs_bits = magnitude == Format::infinity_magnitude ? 0x7f800000u
                   : magnitude > Format::infinity_magnitude ? 0x7fc00000u
                                                            : abs_bits;
    }
    return std::bit_cast<float>(sign | abs_bits);
}

/// float(decode(encode<Format, Rounding, Saturation>(x))) without forming the code: the value
/// is rounded in place in the float's bits (normal range) or as a count of the format's smallest
/// subnormal, converted exactly (below it). Same preconditions as the fast encode path; same
/// bits as the encode-then-decode composition, NaN signs included (the exhaustive tests check).
template <FloatFormat Format, rounding_mode Rounding>
inline constexpr bool has_fast_fake_quantize =
    has_fast_path<Format, Rounding, float> && Format::bias - 1 + Format::mantissa_bits < 126;  // subnormals are normal floats

template <FloatFormat Format, rounding_mode Rounding, saturation_mode Saturation>
    requires(has_fast_fake_quantize<Format, Rounding>)
[[nodiscard]] constexpr float fake_quantize(float x) noexcept
{
    constexpr int drop = 23 - Format::mantissa_bits;
    constexpr int target_min_normal_field = 127 - Format::bias + Format::min_normal_field;
    constexpr std::uint32_t max_bits = std::bit_cast<std::uint32_t>(decode<Format>(Format::max_magnitude));
    constexpr std::uint32_t float_nan = 0x7fc00000u;
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    const std::uint32_t sign = bits & 0x80000000u;
    const std::uint32_t abs_bits = bits & 0x7fffffffu;

    // Round in place at the format's last place: `drop` bits in the normal range, more below it
    // (one more per binade). A carry moves into the exponent by itself.
    const int src_field = static_cast<int>(abs_bits >> 23);
    int shift = drop + target_min_normal_field - src_field;
    shift = shift < drop ? drop : shift > 23 ? 23 : shift;
    const std::uint32_t low_mask = (1u << shift) - 1u;
    std::uint32_t rounded = abs_bits;
    // The parity bit is the last kept bit of the significand: the implicit bit when shift is 23.
    if constexpr (Rounding == rounding_mode::nearest_even) rounded += (low_mask >> 1) + (((abs_bits | 0x800000u) >> shift) & 1u);
    rounded &= ~low_mask;
    // Below the smallest subnormal s the place is the float's implicit bit or above: the result
    // is 0 or s (nearest-even: s for inputs above s/2, the tie s/2 goes to even 0).
    constexpr int min_subnormal_field = target_min_normal_field - Format::mantissa_bits;
    constexpr std::uint32_t min_subnormal_bits = static_cast<std::uint32_t>(min_subnormal_field) << 23;
    constexpr std::uint32_t half_min_subnormal_bits = static_cast<std::uint32_t>(min_subnormal_field - 1) << 23;
    std::uint32_t tiny = 0;
    if constexpr (Rounding == rounding_mode::nearest_even) tiny = magnitude_less(half_min_subnormal_bits, abs_bits) ? min_subnormal_bits : 0u;
    std::uint32_t abs_result = magnitude_less(abs_bits, min_subnormal_bits) ? tiny : rounded;
    constexpr bool saturates = Saturation == saturation_mode::finite || !Format::has_nan;
    bool overflows_to_nan = false;
    if constexpr (saturates) {
        abs_result = abs_result < max_bits ? abs_result : max_bits;
    } else if constexpr (Format::has_infinity) {
        abs_result = abs_result > max_bits ? 0x7f800000u : abs_result;
    } else {
        overflows_to_nan = abs_result > max_bits;
        abs_result = overflows_to_nan ? float_nan : abs_result;
    }
    std::uint32_t result = sign | abs_result;
    const bool is_nan = magnitude_less(0x7f800000u, abs_bits);
    if constexpr (Format::specials == special_values::nan_negative_zero) {
        // One NaN code, 0x80, which decodes with its sign bit set; and no negative zero. As masks:
        // the selects written as ?: and || were control flow that kept GCC 12 from vectorising.
        const std::uint32_t nan_mask = 0u - static_cast<std::uint32_t>(overflows_to_nan | is_nan);
        const std::uint32_t zero_mask = 0u - static_cast<std::uint32_t>(abs_result == 0);
        result = (result & ~nan_mask) | ((0x80000000u | float_nan) & nan_mask);
        result &= ~zero_mask;
    } else if constexpr (Format::has_nan) {
        result = is_nan ? (sign | float_nan) : result;
    } else {
        result = is_nan ? sign : result;  // no NaN: zero with the input's sign, as encode
    }
    return std::bit_cast<float>(result);
}

}  // namespace scalify::detail
