#pragma once
/// \file tensor_core/dot.hpp
/// dot<Model>(a, b, c): one instruction's result for one output, C + sum of K products as the
/// modelled unit computes it, bit for bit. The engine here is the reference for every model (any
/// F, P, K, operand formats and rules); gemm.hpp runs a vectorised copy of it where it can and
/// is checked against it.
///
///     std::array<float8_e4m3fn, 32> a{...}, b{...};
///     float d = tensor_core::dot<tensor_core::h100_qgmma>(a, b, 0.0f);
///
/// Non-finite input (not in the hardware capture; IEEE-like by decision, docs/tensor_core.md):
/// a NaN operand or C gives NaN (0x7fffffff, NVIDIA's canonical NaN), so does inf * 0 and a sum
/// of +inf and -inf terms (products or C); otherwise an infinite product or C gives that
/// infinity.

#include <scalify/error.hpp>
#include <scalify/tensor_core/model.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ranges>
#include <span>
#include <type_traits>

namespace scalify::tensor_core {

namespace detail {

/// The code (bit pattern) of a minifloat, Eigen::half or Eigen::bfloat16 value.
template <EncodedFloat T>
[[nodiscard]] constexpr unsigned code_of(const T& x) noexcept
{
    using storage = typename float_traits<T>::format::storage_type;
    static_assert(sizeof(T) == sizeof(storage) && std::is_trivially_copyable_v<T>,
                  "a tensor-core operand type must be stored as its code, nothing else");
    return std::bit_cast<storage>(x);
}

/// What an operand or accumulator is to the alignment. A finite value is
/// (-1)^negative * significand * 2^lsb with the significand an integer, and `exponent` is its
/// nominal exponent: floor(log2 |x|) for a normal, the smallest normal's for a subnormal.
struct operand {
    enum class kind : std::uint8_t { zero, finite, infinite, nan };
    std::uint32_t significand = 0;
    int lsb = 0;
    int exponent = 0;
    bool negative = false;
    kind what = kind::zero;
};

/// Operand of an encoded float type from its code.
template <FloatFormat Format>
[[nodiscard]] constexpr operand decompose_code(unsigned code) noexcept
{
    operand x;
    x.negative = Format::is_signed && (code & Format::sign_mask) != 0;
    const unsigned magnitude = code & Format::magnitude_mask;
    const int field = static_cast<int>(magnitude >> Format::mantissa_bits);
    const unsigned mantissa = magnitude & Format::mantissa_mask;
    constexpr int all_ones = (1 << Format::exponent_bits) - 1;
    if constexpr (Format::specials == special_values::ieee) {
        if (field == all_ones) {
            x.what = mantissa == 0 ? operand::kind::infinite : operand::kind::nan;
            return x;
        }
    } else if constexpr (Format::specials == special_values::nan_all_ones) {
        if (magnitude == Format::magnitude_mask) {
            x.what = operand::kind::nan;
            return x;
        }
    } else if constexpr (Format::specials == special_values::nan_negative_zero) {
        if (code == Format::canonical_nan) {
            x.what = operand::kind::nan;
            return x;
        }
    }
    if (Format::has_zero && magnitude == 0) return x;  // zero, either sign
    const bool normal = field >= Format::min_normal_field;
    x.significand = normal ? (mantissa | (1u << Format::mantissa_bits)) : mantissa;
    x.exponent = (normal ? field : 1) - Format::bias;
    x.lsb = x.exponent - Format::mantissa_bits;
    x.what = operand::kind::finite;
    return x;
}

template <EncodedFloat T>
[[nodiscard]] constexpr operand decompose(const T& x) noexcept
{
    return decompose_code<typename float_traits<T>::format>(code_of(x));
}

/// Decomposes `count` operands of type T, data[first + i * stride], into out. The engine and the
/// GEMMs read operands through this one typed step, so their bodies are not compiled once per
/// pair of operand types.
using operand_reader = void (*)(const void* data, std::size_t first, std::size_t count, std::size_t stride,
                                operand* out) noexcept;

/// An operand of type T stored as Stored: T itself, or a float32 value on T's grid (a recipe's
/// operand after its cast), which converts to T exactly.
template <EncodedFloat T, class Stored>
[[nodiscard]] constexpr T stored_as(const Stored& x) noexcept
{
    if constexpr (std::same_as<Stored, T>) return x;
    else return T(x);
}

template <EncodedFloat T, class Stored = T>
void read_operands(const void* data, std::size_t first, std::size_t count, std::size_t stride, operand* out) noexcept
{
    const Stored* x = static_cast<const Stored*>(data) + first;
    for (std::size_t i = 0; i < count; ++i) out[i] = decompose(stored_as<T>(x[i * stride]));
}

/// A float32 operand as a tf32 unit reads it: the 10 leading mantissa bits, the rest dropped
/// (truncate) or rounded to nearest even; tf32 has float32's exponent range, so a float32 subnormal
/// is a tf32 subnormal with nominal exponent -126. NaN stays NaN (a payload in the dropped bits
/// included), an infinity infinite.
template <tf32_input Input>
[[nodiscard]] constexpr operand decompose_tf32(float value) noexcept
{
    operand x;
    std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
    x.negative = (bits >> 31) != 0;
    std::uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        x.what = operand::kind::nan;
        return x;
    }
    if constexpr (Input == tf32_input::nearest_even) {
        if (magnitude < 0x7f800000u) {
            const std::uint32_t rest = magnitude & 0x1fffu;
            const std::uint32_t kept = magnitude >> 13;
            magnitude = (kept + ((rest > 0x1000u || (rest == 0x1000u && (kept & 1u) != 0)) ? 1u : 0u)) << 13;
        }
    } else {
        magnitude &= ~std::uint32_t{0x1fffu};
    }
    const int field = static_cast<int>(magnitude >> 23);
    const std::uint32_t mantissa = (magnitude >> 13) & 0x3ffu;
    if (field == 0xff) {
        x.what = operand::kind::infinite;  // a carry into the exponent under nearest_even included
        return x;
    }
    if (magnitude == 0) return x;
    x.significand = field != 0 ? (mantissa | 0x400u) : mantissa;
    x.exponent = (field != 0 ? field : 1) - 127;
    x.lsb = x.exponent - 10;
    x.what = operand::kind::finite;
    return x;
}

/// An operand of type T as a unit with operand set Operands reads it: float as tf32 for the tf32
/// units, otherwise the value of its code.
template <class Operands, class T>
[[nodiscard]] constexpr operand decompose_operand(const T& x) noexcept
{
    if constexpr (reads_tf32<Operands>) {
        static_assert(std::same_as<T, float>, "a tf32 unit reads float operands");
        return decompose_tf32<Operands::input>(x);
    } else {
        return decompose(x);
    }
}

template <tf32_input Input>
void read_tf32_operands(const void* data, std::size_t first, std::size_t count, std::size_t stride, operand* out) noexcept
{
    const float* x = static_cast<const float*>(data) + first;
    for (std::size_t i = 0; i < count; ++i) out[i] = decompose_tf32<Input>(x[i * stride]);
}

/// Operands of some element type, read through its reader.
struct operand_source {
    const void* data;
    operand_reader read;

    void operator()(std::size_t first, std::size_t count, std::size_t stride, operand* out) const noexcept
    {
        read(data, first, count, stride, out);
    }
};

template <EncodedFloat T>
[[nodiscard]] operand_source operands_of(const T* data) noexcept
{
    return {data, &read_operands<T>};
}

/// Operands of type T as a unit with operand set Operands reads them (operands_of, or the tf32
/// reading of float data).
template <class Operands, class T>
[[nodiscard]] operand_source operands_for(const T* data) noexcept
{
    if constexpr (reads_tf32<Operands>) {
        static_assert(std::same_as<T, float>, "a tf32 unit reads float operands");
        return {data, &read_tf32_operands<Operands::input>};
    } else {
        return operands_of(data);
    }
}

/// The float32 accumulator as an operand (its exponent is floor(log2 |c|), subnormals included).
[[nodiscard]] inline operand decompose(float c) noexcept
{
    operand x;
    const auto bits = std::bit_cast<std::uint32_t>(c);
    x.negative = (bits >> 31) != 0;
    const int field = static_cast<int>((bits >> 23) & 0xffu);
    const std::uint32_t mantissa = bits & 0x7fffffu;
    if (field == 0xff) {
        x.what = mantissa == 0 ? operand::kind::infinite : operand::kind::nan;
        return x;
    }
    if (field == 0 && mantissa == 0) return x;
    x.significand = field != 0 ? (mantissa | 0x800000u) : mantissa;
    x.lsb = (field != 0 ? field : 1) - 127 - 23;
    x.exponent = x.lsb + std::bit_width(x.significand) - 1;
    x.what = operand::kind::finite;
    return x;
}

/// The accumulator C as a term: float32 as decompose(float) says; a float16 C with its value's
/// exponent floor(log2 |c|) too (subnormals included; MMA-Sim clamps a float16 subnormal's
/// exponent to -14 instead, which the capture cannot tell apart). Not decompose(Eigen::half): an
/// Eigen::half operand has its nominal exponent.
[[nodiscard]] inline operand decompose_accumulator(float c) noexcept { return decompose(c); }
[[nodiscard]] inline operand decompose_accumulator(Eigen::half c) noexcept
{
    return decompose(static_cast<float>(c));
}

/// NVIDIA's canonical float32 NaN.
[[nodiscard]] inline float canonical_nan() noexcept { return std::bit_cast<float>(0x7fffffffu); }

/// The canonical NaN of an accumulator type (float16: 0x7fff).
template <class Accumulator>
[[nodiscard]] inline Accumulator canonical_nan_of() noexcept
{
    if constexpr (std::same_as<Accumulator, float>) return canonical_nan();
    else return std::bit_cast<Eigen::half>(std::uint16_t{0x7fff});
}

/// +inf or -inf of an accumulator type.
template <class Accumulator>
[[nodiscard]] inline Accumulator infinity_of(bool negative) noexcept
{
    constexpr float inf = std::numeric_limits<float>::infinity();
    if constexpr (std::same_as<Accumulator, float>) return negative ? -inf : inf;
    else return std::bit_cast<Eigen::half>(static_cast<std::uint16_t>(negative ? 0xfc00u : 0x7c00u));
}

/// magnitude * 2^-shift (shift >= 0) rounded as Rounding says; exact integers in, no overflow.
template <rounding_mode Rounding>
[[nodiscard]] constexpr std::uint64_t shift_right(std::uint64_t magnitude, int shift) noexcept
{
    if (shift <= 0) return magnitude;
    if (shift >= 64) {
        // Everything is below the last place kept: zero, or (nearest) at most half an ulp.
        if constexpr (Rounding == rounding_mode::nearest_even) {
            return shift == 64 && magnitude > (std::uint64_t{1} << 63) ? 1 : 0;
        } else {
            return 0;
        }
    }
    const std::uint64_t kept = magnitude >> shift;
    if constexpr (Rounding == rounding_mode::nearest_even) {
        const std::uint64_t rest = magnitude & ((std::uint64_t{1} << shift) - 1);
        const std::uint64_t half = std::uint64_t{1} << (shift - 1);
        return kept + ((rest > half || (rest == half && (kept & 1) != 0)) ? 1 : 0);
    } else {
        return kept;
    }
}

/// The float32 with value (-1)^negative * magnitude * 2^exponent, magnitude already cut to at
/// most 24 significant bits (so a normal result is exact). |value| >= 2^128 gives inf; a value
/// below the normal range lands on the subnormal grid, cut as Rounding says (the hardware's
/// behaviour there was not captured).
template <rounding_mode Rounding>
[[nodiscard]] inline float to_float32(std::uint64_t magnitude, int exponent, bool negative) noexcept
{
    const std::uint32_t sign = negative ? 0x80000000u : 0u;
    const int width = std::bit_width(magnitude);
    const int top = exponent + width - 1;  // floor(log2 |value|)
    if (top >= 128) return std::bit_cast<float>(sign | 0x7f800000u);
    if (top >= -126) {
        const std::uint64_t significand = width >= 24 ? magnitude >> (width - 24) : magnitude << (24 - width);
        const auto field = static_cast<std::uint32_t>(top + 127);
        return std::bit_cast<float>(sign | field << 23 | (static_cast<std::uint32_t>(significand) & 0x7fffffu));
    }
    // Subnormal: units of 2^-149. top < -126 bounds the left shift below 23 bits.
    const int up = exponent + 149;
    const std::uint64_t units = up >= 0 ? magnitude << up : shift_right<Rounding>(magnitude, -up);
    return std::bit_cast<float>(sign | static_cast<std::uint32_t>(units));
}

/// The float16 of (-1)^negative * magnitude * 2^exponent (exact integers in), rounded once as
/// Rounding says to P significant bits, or to the subnormal grid (units of 2^-24) below float16's
/// normal range; 2^16 and above gives inf (nearest even: what rounds to 65536 or more).
template <rounding_mode Rounding, int P>
[[nodiscard]] inline Eigen::half to_float16(std::uint64_t magnitude, int exponent, bool negative) noexcept
{
    const std::uint16_t sign = negative ? 0x8000u : 0u;
    const int top = exponent + std::bit_width(magnitude) - 1;
    const int quantum = std::max(top - (P - 1), -24);  // the last place kept
    if (quantum > exponent) {
        magnitude = shift_right<Rounding>(magnitude, quantum - exponent);
        exponent = quantum;
    }
    if (magnitude == 0) return std::bit_cast<Eigen::half>(sign);
    const int width = std::bit_width(magnitude);
    const int rounded_top = exponent + width - 1;
    if (rounded_top >= 16) return std::bit_cast<Eigen::half>(static_cast<std::uint16_t>(sign | 0x7c00u));
    if (rounded_top < -14) {  // subnormal: units of 2^-24, exponent >= -24
        return std::bit_cast<Eigen::half>(static_cast<std::uint16_t>(sign | (magnitude << (exponent + 24))));
    }
    const std::uint64_t significand = width >= 11 ? magnitude >> (width - 11) : magnitude << (11 - width);
    const auto field = static_cast<std::uint16_t>(rounded_top + 15);
    return std::bit_cast<Eigen::half>(
        static_cast<std::uint16_t>(sign | field << 10 | (static_cast<std::uint16_t>(significand) & 0x3ffu)));
}

/// The bound the alignment needs: |each term| < 2^(F + 2) units, K + 1 of them.
template <InnerProductModel Model>
inline constexpr int sum_bits = Model::alignment_bits + 2 + std::bit_width(Model::k + 1);

/// The engine: C + sum_k a[k]*b[k] under Model, for n <= Model::k products (a shorter
/// instruction is one with zero products at the end); a(i) and b(i) give the i-th operands,
/// decomposed. The reference every faster path is checked against; no precondition beyond
/// n <= Model::k. The GEMMs read decomposed arrays (one body per model); dot decomposes as it
/// goes.
template <InnerProductModel Model, class ReadA, class ReadB>
[[nodiscard]] typename Model::accumulator inner_product_of(const ReadA& a, const ReadB& b, std::size_t n,
                                                           typename Model::accumulator c) noexcept
{
    using rules = typename Model::rules;
    using accumulator = typename Model::accumulator;
    constexpr int F = Model::alignment_bits;
    constexpr int P = Model::result_bits;
    static_assert(sum_bits<Model> <= 62, "F and K too large for the 64-bit exact sum");

    // Non-finite values first: they decide the result alone.
    const operand acc = decompose_accumulator(c);
    bool nan = acc.what == operand::kind::nan;
    bool plus_inf = acc.what == operand::kind::infinite && !acc.negative;
    bool minus_inf = acc.what == operand::kind::infinite && acc.negative;

    // The finite terms: significand, lsb, alignment exponent, sign. Room for K products and C.
    struct term {
        std::uint64_t significand;
        int lsb;
        int exponent;
        bool negative;
    };
    term terms[Model::k + 1];
    std::size_t count = 0;
    int emax = std::numeric_limits<int>::min();
    for (std::size_t i = 0; i < n; ++i) {
        const operand x = a(i);
        const operand y = b(i);
        if (x.what == operand::kind::nan || y.what == operand::kind::nan) {
            nan = true;
            continue;
        }
        const bool infinite = x.what == operand::kind::infinite || y.what == operand::kind::infinite;
        const bool zero = x.what == operand::kind::zero || y.what == operand::kind::zero;
        if (infinite) {
            if (zero) nan = true;  // inf * 0
            else if (x.negative != y.negative) minus_inf = true;
            else plus_inf = true;
            continue;
        }
        if (zero) continue;  // zero products take no part
        term t{std::uint64_t{x.significand} * y.significand, x.lsb + y.lsb, x.exponent + y.exponent,
               x.negative != y.negative};
        if constexpr (rules::exponent == product_exponent::normalised) {
            t.exponent = t.lsb + std::bit_width(t.significand) - 1;
        }
        emax = t.exponent > emax ? t.exponent : emax;
        terms[count++] = t;
    }
    if (nan || (plus_inf && minus_inf)) return canonical_nan_of<accumulator>();
    if (plus_inf || minus_inf) return infinity_of<accumulator>(minus_inf);
    if (acc.what == operand::kind::finite) {
        terms[count++] = term{acc.significand, acc.lsb, acc.exponent, acc.negative};
        emax = acc.exponent > emax ? acc.exponent : emax;
    }
    if (count == 0) return accumulator(0.0f);  // no nonzero term: +0

    // Align to units of 2^(emax - F), each term cut on its own, then one exact sum.
    const int unit = emax - F;
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < count; ++i) {
        const int shift = terms[i].lsb - unit;  // <= F: left shifts stay below 2^62
        const std::uint64_t aligned = shift >= 0 ? terms[i].significand << shift
                                                 : shift_right<rules::alignment>(terms[i].significand, -shift);
        sum += terms[i].negative ? -static_cast<std::int64_t>(aligned) : static_cast<std::int64_t>(aligned);
    }
    if (sum == 0) return accumulator(0.0f);  // an exact zero sum is +0

    // Normalise: cut to P significant bits.
    const bool negative = sum < 0;
    std::uint64_t magnitude = negative ? 0 - static_cast<std::uint64_t>(sum) : static_cast<std::uint64_t>(sum);
    int exponent = unit;
    if constexpr (std::same_as<accumulator, Eigen::half>) {
        // One rounding to the float16 grid (P bits, or units of 2^-24 below the normal range).
        return to_float16<rules::normalisation, P>(magnitude, exponent, negative);
    } else {
        const int excess = std::bit_width(magnitude) - P;
        if (excess > 0) {
            magnitude = shift_right<rules::normalisation>(magnitude, excess);
            exponent += excess;
        }
        return to_float32<rules::normalisation>(magnitude, exponent, negative);
    }
}

/// inner_product_of over decomposed operands.
template <InnerProductModel Model>
[[nodiscard]] typename Model::accumulator inner_product(const operand* a, const operand* b, std::size_t n,
                                                        typename Model::accumulator c) noexcept
{
    return inner_product_of<Model>([a](std::size_t i) { return a[i]; }, [b](std::size_t i) { return b[i]; }, n, c);
}

template <class R>
inline constexpr bool is_const_span = false;
template <class T, std::size_t E>
inline constexpr bool is_const_span<std::span<const T, E>> = true;

}  // namespace detail

/// One instruction's result for one output: c + sum_k a[k]*b[k] as Model's unit computes it, bit
/// for bit. shape_error unless a and b both hold Model::k elements. C and the result are float, or
/// Eigen::half for the float16-accumulator models (*_f16acc).
template <InnerProductModel Model, class TA, class TB>
[[nodiscard]] typename Model::accumulator dot(std::span<const TA> a, std::span<const TB> b, typename Model::accumulator c)
{
    static_assert(Model::template takes<TA, TB>,
                  "this tensor-core model does not take these operand types (the fp8 units, h100_qgmma, "
                  "ada_qmma, b200_qmma: float8_e4m3fn/float8_e5m2 in any pair; the HMMA units: Eigen::half x "
                  "Eigen::half or Eigen::bfloat16 x Eigen::bfloat16, v100_hmma and the *_hmma_f16acc units "
                  "Eigen::half only; the tf32 units: float x float)");
    if (a.size() != Model::k || b.size() != Model::k) {
        SCALIFY_THROW(shape_error(fmt::format("tensor_core::dot<{}>: spans of {} and {} elements; the instruction "
                                              "takes K = {} of each",
                                              Model::name, a.size(), b.size(), Model::k)));
    }
    using operands = typename Model::operands;
    return detail::inner_product_of<Model>([&a](std::size_t i) { return detail::decompose_operand<operands>(a[i]); },
                                           [&b](std::size_t i) { return detail::decompose_operand<operands>(b[i]); },
                                           Model::k, c);
}

/// dot over any contiguous ranges (std::array, std::vector, ...): dot<Model>(a, b, c).
template <InnerProductModel Model, std::ranges::contiguous_range RA, std::ranges::contiguous_range RB>
    requires(!detail::is_const_span<std::remove_cvref_t<RA>> || !detail::is_const_span<std::remove_cvref_t<RB>>)
[[nodiscard]] typename Model::accumulator dot(const RA& a, const RB& b, typename Model::accumulator c)
{
    using TA = std::ranges::range_value_t<RA>;
    using TB = std::ranges::range_value_t<RB>;
    return dot<Model, TA, TB>(std::span<const TA>(std::ranges::data(a), std::ranges::size(a)),
                              std::span<const TB>(std::ranges::data(b), std::ranges::size(b)), c);
}

}  // namespace scalify::tensor_core
