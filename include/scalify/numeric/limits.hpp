#pragma once
/// \file limits.hpp
/// std::numeric_limits and std::hash for minifloat<Format>. min() is the smallest *normal* value,
/// as the standard says (denorm_min() the smallest subnormal).

#include <scalify/numeric/minifloat.hpp>

#include <cstddef>
#include <functional>
#include <limits>

namespace scalify::detail {

template <FloatFormat F>
[[nodiscard]] constexpr minifloat<F> code(unsigned bits) noexcept
{
    return minifloat<F>::from_bits(static_cast<typename F::storage_type>(bits));
}

/// Largest unbiased exponent of a finite value.
template <FloatFormat F>
inline constexpr int max_unbiased_exponent = static_cast<int>(F::max_magnitude >> F::mantissa_bits) - F::bias;

/// Smallest n with 10^n >= x (x > 0), for min_exponent10 / max_exponent10.
[[nodiscard]] constexpr int ceil_log10(double x) noexcept
{
    int n = 0;
    double p = 1.0;
    while (p < x) { p *= 10.0; ++n; }
    while (p / 10.0 >= x) { p /= 10.0; --n; }
    return n;
}

}  // namespace scalify::detail

template <scalify::FloatFormat F>
class std::numeric_limits<scalify::minifloat<F>> {
    using T = scalify::minifloat<F>;
    static constexpr bool has_subnormals = F::has_zero && F::mantissa_bits > 0;
    static constexpr unsigned min_normal_code = static_cast<unsigned>(F::min_normal_field) << F::mantissa_bits;

public:
    static constexpr bool is_specialized = true;
    static constexpr bool is_signed = F::is_signed;
    static constexpr bool is_integer = false;
    static constexpr bool is_exact = false;
    static constexpr bool has_infinity = F::has_infinity;
    static constexpr bool has_quiet_NaN = F::has_nan;
    static constexpr bool has_signaling_NaN = false;
    static constexpr std::float_denorm_style has_denorm = has_subnormals ? std::denorm_present : std::denorm_absent;
    static constexpr bool has_denorm_loss = false;
    static constexpr std::float_round_style round_style = std::round_to_nearest;
    static constexpr bool is_iec559 = false;
    static constexpr bool is_bounded = true;
    static constexpr bool is_modulo = false;
    static constexpr int digits = F::mantissa_bits + 1;
    static constexpr int digits10 = (digits - 1) * 30103 / 100000;     // floor((p - 1) log10 2)
    static constexpr int max_digits10 = 2 + digits * 30103 / 100000;  // ceil(1 + p log10 2)
    static constexpr int radix = 2;
    static constexpr int min_exponent = F::min_normal_field - F::bias + 1;
    static constexpr int max_exponent = scalify::detail::max_unbiased_exponent<F> + 1;
    static constexpr int min_exponent10 = scalify::detail::ceil_log10(
        static_cast<double>(scalify::detail::decode<F>(min_normal_code)));
    static constexpr int max_exponent10 =
        scalify::detail::ceil_log10(static_cast<double>(scalify::detail::decode<F>(F::max_magnitude)) + 1.0) - 1;
    static constexpr bool traps = false;
    static constexpr bool tinyness_before = false;

    static constexpr T min() noexcept { return scalify::detail::code<F>(min_normal_code); }
    static constexpr T lowest() noexcept { return F::is_signed ? -max() : min(); }
    static constexpr T max() noexcept { return scalify::detail::code<F>(F::max_magnitude); }
    static constexpr T epsilon() noexcept { return T(scalify::detail::exact_float(1, -F::mantissa_bits)); }
    static constexpr T round_error() noexcept { return T(0.5f); }
    /// +inf where the format has one; otherwise T() as the primary template returns.
    static constexpr T infinity() noexcept
    {
        return F::has_infinity ? scalify::detail::code<F>(F::infinity_magnitude) : T();
    }
    /// The canonical NaN where the format has one; otherwise T().
    static constexpr T quiet_NaN() noexcept { return F::has_nan ? scalify::detail::code<F>(F::canonical_nan) : T(); }
    static constexpr T signaling_NaN() noexcept { return quiet_NaN(); }
    static constexpr T denorm_min() noexcept { return has_subnormals ? scalify::detail::code<F>(1) : min(); }
};

/// Hash consistent with ==: +0 and -0 hash alike.
template <scalify::FloatFormat F>
struct std::hash<scalify::minifloat<F>> {
    [[nodiscard]] std::size_t operator()(scalify::minifloat<F> x) const noexcept
    {
        const unsigned bits = x.bits();
        const bool zero = F::has_zero && (bits & F::magnitude_mask) == 0 && !scalify::isnan(x);
        return std::hash<unsigned>{}(zero ? 0u : bits);
    }
};
