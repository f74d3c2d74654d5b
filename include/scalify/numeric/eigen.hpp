#pragma once
/// \file eigen.hpp
/// Eigen interoperability: Eigen::NumTraits for minifloat (so Eigen::Matrix<float8_e4m3fn, ...>
/// works with .cast<>()), and float_traits for Eigen::half / Eigen::bfloat16, so convert<> rounds
/// into them with every rounding and saturation policy.

#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/limits.hpp>

#include <scalify/detail/eigen_core.hpp>

#include <cstdint>

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
