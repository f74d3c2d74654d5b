#pragma once
/// \file eigen.hpp
/// Eigen interoperability: Eigen::NumTraits for minifloat (so Eigen::Matrix<float8_e4m3fn, ...>
/// works with .cast<>()), and float_traits for Eigen::half / Eigen::bfloat16, so convert<> rounds
/// into them with every rounding and saturation policy. Also xtensor's traits for half and
/// bfloat16, as minifloat.hpp gives them for the minifloats: xt::sum / prod / mean over their data
/// accumulate in float, amax / amin select in the type, the norms accumulate in double.

#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/limits.hpp>

#include <scalify/detail/eigen_core.hpp>

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace scalify {

template <>
struct float_traits<Eigen::half> {
    using format = formats::binary16;
    [[nodiscard]] static Eigen::half from_bits(std::uint16_t bits) noexcept
    {
        return Eigen::half(Eigen::half_impl::raw_uint16_to_half(bits));
    }
    [[nodiscard]] static float to_float(Eigen::half x) noexcept { return static_cast<float>(x); }
};

template <>
struct float_traits<Eigen::bfloat16> {
    using format = formats::bfloat16;
    [[nodiscard]] static Eigen::bfloat16 from_bits(std::uint16_t bits) noexcept
    {
        return Eigen::bfloat16(Eigen::bfloat16_impl::raw_uint16_to_bfloat16(bits));
    }
    [[nodiscard]] static float to_float(Eigen::bfloat16 x) noexcept { return static_cast<float>(x); }
};

}  // namespace scalify

namespace Eigen {

template <scalify::FloatFormat F>
struct NumTraits<scalify::minifloat<F>> : GenericNumTraits<scalify::minifloat<F>> {
    using T = scalify::minifloat<F>;
    enum {
        IsSigned = F::is_signed,
        IsInteger = 0,
        IsComplex = 0,
        RequireInitialization = 0,
        ReadCost = 1,
        AddCost = 3,  // decode, add in float, round
        MulCost = 3
    };
    using Real = T;
    using NonInteger = T;
    using Literal = T;
    static constexpr T epsilon() { return std::numeric_limits<T>::epsilon(); }
    static constexpr T dummy_precision() { return std::numeric_limits<T>::epsilon(); }
    static constexpr T highest() { return (std::numeric_limits<T>::max)(); }
    static constexpr T lowest() { return std::numeric_limits<T>::lowest(); }
    static constexpr T infinity() { return std::numeric_limits<T>::infinity(); }
    static constexpr T quiet_NaN() { return std::numeric_limits<T>::quiet_NaN(); }
    static constexpr int digits10() { return std::numeric_limits<T>::digits10; }
};

}  // namespace Eigen

// xtensor's traits for the Eigen 16-bit types (declared in minifloat.hpp). Their own arithmetic,
// and with it xtensor's element-wise operators on them, stays Eigen's.

namespace xtl {
template <class... T>
struct promote_type;
}  // namespace xtl

/// xtensor combines the element types of an expression's operands with xtl::promote_type, the
/// type of a + b. xt::cast<float>(data) keeps the data's type there, so xt::mean(xt::cast<float>(
/// bfloat16 data)) asks for bfloat16 + double, which ISO C++ finds ambiguous (Eigen's
/// bfloat16 + int against the built-in float + double; half has the same with /): with a float
/// or double, both types give what float gives.
template <std::floating_point T>
struct xtl::promote_type<Eigen::half, T> {
    using type = decltype(std::declval<float>() + std::declval<T>());
};
template <std::floating_point T>
struct xtl::promote_type<T, Eigen::half> : xtl::promote_type<Eigen::half, T> {};
template <std::floating_point T>
struct xtl::promote_type<Eigen::bfloat16, T> {
    using type = decltype(std::declval<float>() + std::declval<T>());
};
template <std::floating_point T>
struct xtl::promote_type<T, Eigen::bfloat16> : xtl::promote_type<Eigen::bfloat16, T> {};

template <>
struct xtl::is_scalar<Eigen::half> : std::true_type {};
template <>
struct xtl::is_scalar<Eigen::bfloat16> : std::true_type {};

template <>
struct xtl::big_promote_type<Eigen::half> {
    using type = double;
};
template <>
struct xtl::big_promote_type<Eigen::bfloat16> {
    using type = double;
};

/// A sum over bfloat16 data would go on as float + bfloat16, which is ambiguous: xt::sum and
/// xt::mean over it fail with a static_assert naming xt::cast<float>(data) (prod, amax, amin and
/// the norms work).
template <>
inline constexpr bool scalify::detail::adds_to_float<Eigen::bfloat16> = false;

template <>
struct xt::const_value<Eigen::half> : scalify::detail::narrow_float_const_value<Eigen::half> {
    using scalify::detail::narrow_float_const_value<Eigen::half>::narrow_float_const_value;
};
template <>
struct xt::const_value<Eigen::bfloat16> : scalify::detail::narrow_float_const_value<Eigen::bfloat16> {
    using scalify::detail::narrow_float_const_value<Eigen::bfloat16>::narrow_float_const_value;
};
