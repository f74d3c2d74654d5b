#pragma once
/// \file minifloat.hpp
/// minifloat<Format>: the value type of every small float format (fp8, fp6, fp4, e8m0), in the
/// layers of Eigen's Half.h: raw bits, explicit rounding constructors, arithmetic through float.
/// Mixed with another type a minifloat computes as the float it widens to; the end of this file
/// makes xtensor's reducers and traits follow that rule (docs/ops.md, "Reading the data back").

#include <scalify/detail/encode.hpp>
#include <scalify/numeric/format.hpp>

#include <array>
#include <compare>
#include <concepts>
#include <cstddef>
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

// ---------------------------------------------------------------------------------------------
// xtensor interoperability
//
// xtensor takes an expression's accumulator and helper types from the element type: its reducers
// fold from xt::const_value<value_type> with the element's own +, and xtl::select (amax, amin,
// where, maximum) and the norms ask xtl's traits. Left to its defaults, xt::sum over minifloat
// data would fold in the minifloat, rounding at every step (and stalling once the total's spacing
// exceeds the elements), xt::amax would not compile, and xt::norm_l2 would accumulate in the
// minifloat. Here, with the type, so that every translation unit that can name a minifloat sees
// these specialisations before any use (one that folded in the minifloat beside one that folds in
// float would break the one-definition rule):
//   - xt::sum / prod / mean over minifloat data accumulate in float, and return float (mean:
//     double, as for float data); amax / amin select exactly and return the minifloat;
//   - the norms accumulate in double, as xtensor's do for float (xtl::big_promote_type);
//   - an arithmetic operator on xtensor operands of one minifloat format, whose every element
//     and intermediate would be rounded to that format, fails with one static_assert naming the
//     float forms (mixed operands compute in float or double, as the operators above do).
// xtensor's templates are declared here, not included, so that this header stays cheap to parse
// (<xtensor/xreducer.hpp> alone takes ten times as long). The declarations are xtensor 0.24's and
// xtl 0.7's.

namespace xtl {
template <class T>
struct is_scalar;
template <class T>
struct big_promote_type;
}  // namespace xtl

namespace xt {
template <class D>
class xexpression;
template <class T>
struct const_value;
}  // namespace xt

namespace scalify::detail {

/// Whether float + T picks one operator, so that a reducer can go on adding T elements to a float
/// sum. Not for Eigen::bfloat16, whose + (bfloat16, int) overloads make it ambiguous (eigen.hpp).
template <class T>
inline constexpr bool adds_to_float = true;

/// The value xtensor's reducers fold a narrow-float array from (xt::const_value<T> below): sum
/// starts from T(0), prod from T(1), amax from lowest(). An element added to it or multiplied by
/// it gives float, so sums and products accumulate in float; it converts back to T, so amax and
/// amin select exactly and keep T.
template <class T>
struct reduction_start {
    T value;

    constexpr operator T() const noexcept { return value; }
    constexpr operator float() const noexcept { return static_cast<float>(value); }

    /// float; T where the static_assert rejects the sum, so that the accumulation after it stays
    /// well-formed and the static_assert is the only error.
    using sum_type = std::conditional_t<adds_to_float<T>, float, T>;

    [[nodiscard]] friend constexpr sum_type operator+(reduction_start start, const T& x) noexcept
    {
        static_assert(adds_to_float<T>,
                      "xtensor cannot sum this type in float (float + Eigen::bfloat16 is ambiguous): "
                      "sum xt::cast<float>(data) instead");
        if constexpr (Minifloat<T>) {
            // T(0) is NaN in a format without zero, and would make every sum NaN.
            static_assert(T::format::has_zero,
                          "this minifloat format has no zero, so xtensor's sums over it cannot start from 0: "
                          "sum xt::cast<float>(data) instead");
        }
        return static_cast<sum_type>(static_cast<float>(start.value) + static_cast<float>(x));
    }
    [[nodiscard]] friend constexpr float operator*(reduction_start start, const T& x) noexcept
    {
        return static_cast<float>(start.value) * static_cast<float>(x);
    }
};

/// xt::const_value<T> for a narrow float T: the interface of xtensor's primary template, holding
/// a reduction_start.
template <class T>
struct narrow_float_const_value {
    using value_type = reduction_start<T>;

    constexpr narrow_float_const_value() = default;
    constexpr narrow_float_const_value(T start) noexcept : m_value{start} {}

    [[nodiscard]] constexpr value_type operator()() const noexcept { return m_value; }

    template <class NT>
    using rebind_t = xt::const_value<NT>;
    template <class NT>
    [[nodiscard]] xt::const_value<NT> rebind() const
    {
        return xt::const_value<NT>(m_value);
    }

    value_type m_value{};  // public, as xtensor's const_value_rebinder reads it
};

template <class E>
concept xtensor_expression = std::is_base_of_v<xt::xexpression<std::decay_t<E>>, std::decay_t<E>>;

/// The element type of an xtensor operand: an expression's value_type, or the scalar itself.
template <class E>
struct xtensor_operand_element {
    using type = std::decay_t<E>;
};
template <xtensor_expression E>
struct xtensor_operand_element<E> {
    using type = typename std::decay_t<E>::value_type;
};
template <class E>
using xtensor_operand_element_t = typename xtensor_operand_element<E>::type;

/// Operands of an xtensor operator (at least one an expression) whose elements are all of one
/// minifloat format: the element-wise result would be rounded to that format.
template <class E1, class E2>
concept same_minifloat_xtensor_operands =
    (xtensor_expression<E1> || xtensor_expression<E2>) && Minifloat<xtensor_operand_element_t<E1>> &&
    std::same_as<xtensor_operand_element_t<E1>, xtensor_operand_element_t<E2>>;

/// One static_assert per format (not per expression type), so that a longer expression reports once.
template <class Element>
constexpr void reject_same_minifloat_xtensor_arithmetic() noexcept
{
    static_assert(!Minifloat<Element>,
                  "xtensor arithmetic on operands of one minifloat format would round every element, and every "
                  "intermediate, to that format. Compute in float: xt::cast<float>(a.data()), cast<float>(a).data(), "
                  "or a.value() (data times scale)");
}

/// What a rejected operator returns: its expression operand, so that the caller's code stays
/// well-typed and the static_assert is the only error.
template <class E1, class E2>
[[nodiscard]] auto rejected_operator_result(E1&& e1, E2&& e2)
{
    if constexpr (xtensor_expression<E1>) return std::decay_t<E1>(std::forward<E1>(e1));
    else return std::decay_t<E2>(std::forward<E2>(e2));
}

}  // namespace scalify::detail

namespace scalify {

// Found by argument-dependent lookup beside xtensor's operator templates, and preferred to them
// as the more constrained; only ever instantiated to fail.

template <class E1, class E2>
    requires detail::same_minifloat_xtensor_operands<E1, E2>
auto operator+(E1&& e1, E2&& e2)
{
    detail::reject_same_minifloat_xtensor_arithmetic<detail::xtensor_operand_element_t<E1>>();
    return detail::rejected_operator_result(std::forward<E1>(e1), std::forward<E2>(e2));
}

template <class E1, class E2>
    requires detail::same_minifloat_xtensor_operands<E1, E2>
auto operator-(E1&& e1, E2&& e2)
{
    detail::reject_same_minifloat_xtensor_arithmetic<detail::xtensor_operand_element_t<E1>>();
    return detail::rejected_operator_result(std::forward<E1>(e1), std::forward<E2>(e2));
}

template <class E1, class E2>
    requires detail::same_minifloat_xtensor_operands<E1, E2>
auto operator*(E1&& e1, E2&& e2)
{
    detail::reject_same_minifloat_xtensor_arithmetic<detail::xtensor_operand_element_t<E1>>();
    return detail::rejected_operator_result(std::forward<E1>(e1), std::forward<E2>(e2));
}

template <class E1, class E2>
    requires detail::same_minifloat_xtensor_operands<E1, E2>
auto operator/(E1&& e1, E2&& e2)
{
    detail::reject_same_minifloat_xtensor_arithmetic<detail::xtensor_operand_element_t<E1>>();
    return detail::rejected_operator_result(std::forward<E1>(e1), std::forward<E2>(e2));
}

// xtensor's norms (xt::norm_l0, norm_l1, norm_l2, norm_linf, norm_sq) call these on each
// element, found by argument-dependent lookup: they are float's, on the exact widened value
// (abs is the minifloat's, exact).

template <FloatFormat F>
[[nodiscard]] std::size_t norm_l0(minifloat<F> x) noexcept
{
    return x != 0 ? 1 : 0;
}
template <FloatFormat F>
[[nodiscard]] float norm_l1(minifloat<F> x) noexcept
{
    return static_cast<float>(abs(x));
}
template <FloatFormat F>
[[nodiscard]] float norm_l2(minifloat<F> x) noexcept
{
    return static_cast<float>(abs(x));
}
template <FloatFormat F>
[[nodiscard]] float norm_linf(minifloat<F> x) noexcept
{
    return static_cast<float>(abs(x));
}
template <FloatFormat F>
[[nodiscard]] float norm_sq(minifloat<F> x) noexcept
{
    const float widened = static_cast<float>(x);
    return widened * widened;
}

}  // namespace scalify

/// xtl::select (amax, amin, where, maximum) takes only types xtl calls scalars.
template <scalify::FloatFormat F>
struct xtl::is_scalar<scalify::minifloat<F>> : std::true_type {};
template <class T>
struct xtl::is_scalar<scalify::detail::reduction_start<T>> : std::true_type {};

/// The norms' accumulator: double, as for float.
template <scalify::FloatFormat F>
struct xtl::big_promote_type<scalify::minifloat<F>> {
    using type = double;
};

/// The reducers' starting value (sum, prod, amax, amin, mean, ...).
template <scalify::FloatFormat F>
struct xt::const_value<scalify::minifloat<F>> : scalify::detail::narrow_float_const_value<scalify::minifloat<F>> {
    using scalify::detail::narrow_float_const_value<scalify::minifloat<F>>::narrow_float_const_value;
};
