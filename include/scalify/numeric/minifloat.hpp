#pragma once
/// \file minifloat.hpp
/// minifloat<Format>: the value type of every small float format (fp8, fp6, fp4, e8m0), in the
/// layers of Eigen's Half.h: raw bits, explicit rounding constructors, arithmetic through float.
/// Mixed with another type a minifloat computes as the float it widens to.

#include <scalify/detail/encode.hpp>
#include <scalify/numeric/format.hpp>

#include <array>
#include <compare>
#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

namespace scalify {

template <FloatFormat Format>
class minifloat;

namespace detail {

template <FloatFormat Format>
[[nodiscard]] consteval auto make_decode_table() noexcept
{
    std::array<float, (std::size_t{1} << Format::total_bits)> table{};
    for (unsigned code = 0; code < table.size(); ++code) table[code] = decode<Format>(code);
    return table;
}

/// code -> float for formats of at most 8 bits (1 KiB at most); wider formats decode arithmetically.
template <FloatFormat Format>
inline constexpr auto decode_table = make_decode_table<Format>();

template <FloatFormat Format>
[[nodiscard]] constexpr float to_float(typename Format::storage_type code) noexcept
{
    if constexpr (Format::total_bits <= 8) {
        return decode_table<Format>[code];
    } else {
        return decode<Format>(code);
    }
}

template <class T>
struct is_minifloat : std::false_type {};
template <class F>
struct is_minifloat<minifloat<F>> : std::true_type {};

}  // namespace detail

/// True for every minifloat<Format>.
template <class T>
concept Minifloat = detail::is_minifloat<std::remove_cv_t<T>>::value;

/// A type (not float, double or an integer) that converts to float exactly, such as another
/// minifloat, Eigen::half or Eigen::bfloat16.
template <class T>
concept FloatLike = !std::is_arithmetic_v<T> && requires(const T& t) { static_cast<float>(t); };

/// A float type narrower than float that widens to it exactly: a minifloat of any format,
/// Eigen::half, Eigen::bfloat16 (the FloatLike types with a std::numeric_limits specialisation).
template <class T>
concept NarrowFloat = Minifloat<T> || (FloatLike<T> && std::numeric_limits<T>::is_specialized);

namespace detail {

template <class T>
concept arithmetic = std::is_arithmetic_v<T>;

/// The type of float op T: float for float and the integers, double for double.
template <arithmetic T>
using float_promoted_t = decltype(std::declval<float>() + std::declval<T>());

}  // namespace detail

/// A small binary float stored in Format::storage_type (one byte for every fp8/fp6/fp4 format).
/// Construction from a wider value rounds to nearest even without saturation, as ml_dtypes does;
/// convert<> picks other policies. Conversions to float and double are exact.
template <FloatFormat Format>
class minifloat {
public:
    using format = Format;
    using storage_type = typename Format::storage_type;

    /// The code 0: +0 (or 2^-127 for e8m0fnu, which has no zero).
    constexpr minifloat() noexcept = default;

    explicit constexpr minifloat(float x) noexcept
        : m_bits(detail::encode<Format, rounding_mode::nearest_even, saturation_mode::none>(x))
    {}
    /// One rounding straight from double (no double rounding through float).
    explicit constexpr minifloat(double x) noexcept
        : m_bits(detail::encode<Format, rounding_mode::nearest_even, saturation_mode::none>(x))
    {}
    /// Integers go through double: exact up to 2^53, beyond which they are rounded twice.
    template <std::integral I>
    explicit constexpr minifloat(I x) noexcept : minifloat(static_cast<double>(x))
    {}
    /// Other minifloats, Eigen::half, Eigen::bfloat16: widened to float exactly, then rounded once.
    template <FloatLike T>
    explicit constexpr minifloat(const T& x) noexcept : minifloat(static_cast<float>(x))
    {}

    /// The value with this code. Bits above Format::total_bits are ignored.
    [[nodiscard]] static constexpr minifloat from_bits(storage_type bits) noexcept
    {
        minifloat result;
        result.m_bits = static_cast<storage_type>(bits & ((1u << Format::total_bits) - 1u));
        return result;
    }
    [[nodiscard]] constexpr storage_type bits() const noexcept { return m_bits; }

    [[nodiscard]] explicit constexpr operator float() const noexcept { return detail::to_float<Format>(m_bits); }
    [[nodiscard]] explicit constexpr operator double() const noexcept
    {
        return static_cast<double>(detail::to_float<Format>(m_bits));
    }

    constexpr minifloat& operator+=(minifloat other) noexcept { return *this = *this + other; }
    constexpr minifloat& operator-=(minifloat other) noexcept { return *this = *this - other; }
    constexpr minifloat& operator*=(minifloat other) noexcept { return *this = *this * other; }
    constexpr minifloat& operator/=(minifloat other) noexcept { return *this = *this / other; }

    // Arithmetic is computed in float and rounded once to nearest even. Float carries more than
    // 2p + 2 bits for every format here, so each result is the correctly rounded one.
    [[nodiscard]] friend constexpr minifloat operator+(minifloat a, minifloat b) noexcept
    {
        return minifloat(static_cast<float>(a) + static_cast<float>(b));
    }
    [[nodiscard]] friend constexpr minifloat operator-(minifloat a, minifloat b) noexcept
    {
        return minifloat(static_cast<float>(a) - static_cast<float>(b));
    }
    [[nodiscard]] friend constexpr minifloat operator*(minifloat a, minifloat b) noexcept
    {
        return minifloat(static_cast<float>(a) * static_cast<float>(b));
    }
    [[nodiscard]] friend constexpr minifloat operator/(minifloat a, minifloat b) noexcept
    {
        return minifloat(static_cast<float>(a) / static_cast<float>(b));
    }
    [[nodiscard]] friend constexpr minifloat operator+(minifloat a) noexcept { return a; }
    [[nodiscard]] friend constexpr minifloat operator-(minifloat a) noexcept
    {
        if constexpr (!Format::is_signed) {
            return minifloat(-static_cast<float>(a));  // every negative value is NaN here
        } else if constexpr (Format::specials == special_values::nan_negative_zero) {
            // Zero and the NaN (1000...0) are their own negation; flipping would swap them.
            return (a.m_bits & Format::magnitude_mask) == 0 ? a : from_bits(static_cast<storage_type>(a.m_bits ^ Format::sign_mask));
        } else {
            return from_bits(static_cast<storage_type>(a.m_bits ^ Format::sign_mask));
        }
    }

    /// IEEE comparison: NaN is unordered, +0 == -0.
    [[nodiscard]] friend constexpr bool operator==(minifloat a, minifloat b) noexcept
    {
        return static_cast<float>(a) == static_cast<float>(b);
    }
    [[nodiscard]] friend constexpr std::partial_ordering operator<=>(minifloat a, minifloat b) noexcept
    {
        return static_cast<float>(a) <=> static_cast<float>(b);
    }

    // Mixed arithmetic. The minifloat widens exactly to float and the operation is float's, so
    // minifloat op T has the type of float op T: float with float and the integers, double with
    // double, as numpy with ml_dtypes promotes float8 with float32 to float32. With another narrow
    // format (another minifloat, half, bfloat16) it is float, which holds both exactly. Nothing
    // is rounded to the format; minifloat(x) or convert<> stores a result back.
#define SCALIFY_MINIFLOAT_MIXED_OPERATOR(OP)                                                                 \
    template <detail::arithmetic T>                                                                          \
    [[nodiscard]] friend constexpr detail::float_promoted_t<T> operator OP(minifloat a, T b) noexcept        \
    {                                                                                                        \
        return static_cast<detail::float_promoted_t<T>>(static_cast<float>(a)) OP b;                         \
    }                                                                                                        \
    template <detail::arithmetic T>                                                                          \
    [[nodiscard]] friend constexpr detail::float_promoted_t<T> operator OP(T a, minifloat b) noexcept        \
    {                                                                                                        \
        return a OP static_cast<detail::float_promoted_t<T>>(static_cast<float>(b));                         \
    }                                                                                                        \
    template <NarrowFloat T>                                                                                 \
        requires(!std::same_as<T, minifloat>)                                                                \
    [[nodiscard]] friend constexpr float operator OP(minifloat a, const T& b) noexcept                       \
    {                                                                                                        \
        return static_cast<float>(a) OP static_cast<float>(b);                                               \
    }                                                                                                        \
    /* Not for another minifloat, whose own operator above takes that pair. */                               \
    template <NarrowFloat T>                                                                                 \
        requires(!Minifloat<T>)                                                                              \
    [[nodiscard]] friend constexpr float operator OP(const T& a, minifloat b) noexcept                       \
    {                                                                                                        \
        return static_cast<float>(a) OP static_cast<float>(b);                                               \
    }
    SCALIFY_MINIFLOAT_MIXED_OPERATOR(+)
    SCALIFY_MINIFLOAT_MIXED_OPERATOR(-)
    SCALIFY_MINIFLOAT_MIXED_OPERATOR(*)
    SCALIFY_MINIFLOAT_MIXED_OPERATOR(/)
#undef SCALIFY_MINIFLOAT_MIXED_OPERATOR

    // Mixed comparisons, on the same widened values (C++20 derives the reversed forms and !=).
    template <detail::arithmetic T>
    [[nodiscard]] friend constexpr bool operator==(minifloat a, T b) noexcept
    {
        using P = detail::float_promoted_t<T>;
        return static_cast<P>(static_cast<float>(a)) == static_cast<P>(b);
    }
    template <detail::arithmetic T>
    [[nodiscard]] friend constexpr std::partial_ordering operator<=>(minifloat a, T b) noexcept
    {
        using P = detail::float_promoted_t<T>;
        return static_cast<P>(static_cast<float>(a)) <=> static_cast<P>(b);
    }
    template <NarrowFloat T>
        requires(!std::same_as<T, minifloat>)
    [[nodiscard]] friend constexpr bool operator==(minifloat a, const T& b) noexcept
    {
        return static_cast<float>(a) == static_cast<float>(b);
    }
    template <NarrowFloat T>
        requires(!std::same_as<T, minifloat>)
    [[nodiscard]] friend constexpr std::partial_ordering operator<=>(minifloat a, const T& b) noexcept
    {
        return static_cast<float>(a) <=> static_cast<float>(b);
    }

private:
    storage_type m_bits{};
};

/// The ml_dtypes family, with ml_dtypes' names and encodings (docs/formats.md has the table).
using float8_e4m3fn = minifloat<formats::e4m3fn>;
using float8_e5m2 = minifloat<formats::e5m2>;
using float8_e4m3fnuz = minifloat<formats::e4m3fnuz>;
using float8_e5m2fnuz = minifloat<formats::e5m2fnuz>;
using float8_e4m3b11fnuz = minifloat<formats::e4m3b11fnuz>;
using float8_e3m4 = minifloat<formats::e3m4>;
using float8_e4m3 = minifloat<formats::e4m3>;
using float8_e8m0fnu = minifloat<formats::e8m0fnu>;
using float6_e2m3fn = minifloat<formats::e2m3fn>;
using float6_e3m2fn = minifloat<formats::e3m2fn>;
using float4_e2m1fn = minifloat<formats::e2m1fn>;

// Classification, found by ADL like Eigen's numext functions; all work on the bits.

template <FloatFormat F>
[[nodiscard]] constexpr bool isnan(minifloat<F> x) noexcept
{
    const unsigned magnitude = x.bits() & F::magnitude_mask;
    if constexpr (F::specials == special_values::ieee) return magnitude > F::infinity_magnitude;
    else if constexpr (F::specials == special_values::nan_all_ones) return magnitude == F::magnitude_mask;
    else if constexpr (F::specials == special_values::nan_negative_zero) return x.bits() == F::canonical_nan;
    else return false;
}

template <FloatFormat F>
[[nodiscard]] constexpr bool isinf(minifloat<F> x) noexcept
{
    if constexpr (F::has_infinity) return (x.bits() & F::magnitude_mask) == F::infinity_magnitude;
    else return false;
}

template <FloatFormat F>
[[nodiscard]] constexpr bool isfinite(minifloat<F> x) noexcept
{
    return !isnan(x) && !isinf(x);
}

/// True for negative values and -0 (the NaN of 'fnuz' formats has its sign bit set too).
template <FloatFormat F>
[[nodiscard]] constexpr bool signbit(minifloat<F> x) noexcept
{
    return (x.bits() & F::sign_mask) != 0;
}

template <FloatFormat F>
[[nodiscard]] constexpr minifloat<F> abs(minifloat<F> x) noexcept
{
    if (isnan(x) || !F::is_signed) return x;
    return minifloat<F>::from_bits(static_cast<typename F::storage_type>(x.bits() & F::magnitude_mask));
}

}  // namespace scalify

// ---------------------------------------------------------------------------------------------
// Common types: what the mixed operators above return.

template <scalify::FloatFormat F, class T>
    requires std::is_arithmetic_v<T>
struct std::common_type<scalify::minifloat<F>, T> : std::common_type<float, T> {};
template <class T, scalify::FloatFormat F>
    requires std::is_arithmetic_v<T>
struct std::common_type<T, scalify::minifloat<F>> : std::common_type<float, T> {};
template <scalify::FloatFormat F, class T>
    requires(scalify::NarrowFloat<T> && !scalify::Minifloat<T>)
struct std::common_type<scalify::minifloat<F>, T> {
    using type = float;
};
template <class T, scalify::FloatFormat F>
    requires(scalify::NarrowFloat<T> && !scalify::Minifloat<T>)
struct std::common_type<T, scalify::minifloat<F>> {
    using type = float;
};
template <scalify::FloatFormat F, scalify::FloatFormat G>
    requires(!std::same_as<F, G>)
struct std::common_type<scalify::minifloat<F>, scalify::minifloat<G>> {
    using type = float;
};
