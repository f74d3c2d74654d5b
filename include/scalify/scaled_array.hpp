#pragma once
/// \file scaled_array.hpp
/// ScaledArray<T, ScalePolicy>: an xt::xarray<T> of data and one scale; the array's value is
/// data * scale. Scale policies: float_scale (any finite non-negative float) and pow2_scale
/// (zero or an exact power of two, so rescaling never rounds). A scale of 0 is a zero array,
/// whatever the data holds.
///
///     auto w = make_scaled_array<pow2_scale>(xt::xarray<float8_e4m3fn>{...}, 0.25f);
///     auto x = as_scaled_array(xt::xarray<float>{{1, 2}, {3, 4}});   // scale 1
///     xt::xarray<float> v = w.value();                                 // data * scale, in float

#include <scalify/error.hpp>
#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/minifloat.hpp>

#include <xtensor/xarray.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <fmt/format.h>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace scalify {

// ---------------------------------------------------------------------------------------------
// Element types and the compute type

/// A type a ScaledArray can hold: float, double, or a type convert<> rounds into (the
/// minifloats, Eigen::half, Eigen::bfloat16).
template <class T>
concept ScaledElement = std::same_as<T, float> || std::same_as<T, double> || EncodedFloat<T>;

/// What arithmetic on elements of T runs in: double for double, float for everything else
/// (every minifloat, half and bfloat16 widens to float exactly).
template <ScaledElement T>
using compute_t = std::conditional_t<std::same_as<T, double>, double, float>;

/// Data type of a binary op's result unless the caller names one: the common type when both
/// operands agree; otherwise the wider of float/double if either is one; otherwise (two different
/// low-precision types, e.g. e5m2 x e4m3fn) float, because neither format holds the other's range
/// and precision.
template <ScaledElement A, ScaledElement B>
using promote_t = std::conditional_t<
    std::same_as<A, B>, A,
    std::conditional_t<std::same_as<A, double> || std::same_as<B, double>, double, float>>;

namespace detail {

template <ScaledElement T>
[[nodiscard]] constexpr compute_t<T> load(const T& x) noexcept
{
    return static_cast<compute_t<T>>(x);
}

/// Compute type to storage, rounding to nearest even without saturation (ml_dtypes' astype).
template <ScaledElement T, class C>
[[nodiscard]] constexpr T store(C x) noexcept
{
    if constexpr (std::same_as<T, float> || std::same_as<T, double>) return static_cast<T>(x);
    else return convert<T>(x);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Scale policies

/// Scale stored as any finite, non-negative float.
struct float_scale {
    static constexpr bool power_of_two = false;
    static constexpr const char* name = "float_scale";
    /// A scale computed by a rule, as this policy stores it: unchanged.
    [[nodiscard]] static float from_rule(float scale) noexcept { return scale; }
};

/// Scale stored as zero or an exact power of two: multiplying data by a ratio of two scales is
/// then exact (barring under/overflow), and hardware applies it as an exponent add.
struct pow2_scale {
    static constexpr bool power_of_two = true;
    static constexpr const char* name = "pow2_scale";
    /// A scale computed by a rule (e.g. sqrt(K)), rounded to the nearest power of two in log2
    /// (ties up: sqrt(2) -> 2, see pow2_round_nearest). The remainder folds into the data.
    [[nodiscard]] static float from_rule(float scale) noexcept;
};

template <class P>
concept ScalePolicy = requires(float s) {
    { P::power_of_two } -> std::convertible_to<bool>;
    { P::name } -> std::convertible_to<const char*>;
    { P::from_rule(s) } -> std::same_as<float>;
};

/// Policy of a result computed from two operands: pow2 only if both are.
template <ScalePolicy A, ScalePolicy B>
using common_policy_t = std::conditional_t<A::power_of_two && B::power_of_two, pow2_scale, float_scale>;

/// True for +-0 and exact powers of two (normal or subnormal floats).
[[nodiscard]] inline bool is_pow2_or_zero(float s) noexcept
{
    if (s == 0.0f) return true;
    if (!std::isfinite(s) || s < 0.0f) return false;
    int exponent = 0;
    return std::frexp(s, &exponent) == 0.5f;
}

/// Largest power of two <= s, for finite s > 0.
[[nodiscard]] inline float pow2_round_down(float s) noexcept
{
    int exponent = 0;
    std::frexp(s, &exponent);  // s = m * 2^exponent, m in [0.5, 1)
    return std::ldexp(1.0f, exponent - 1);
}

/// Smallest power of two >= s, for finite s > 0.
[[nodiscard]] inline float pow2_round_up(float s) noexcept
{
    const float down = pow2_round_down(s);
    return down == s ? s : 2.0f * down;
}

/// Power of two nearest to s in log2, ties up, for finite s > 0: s / down lies in [1, 2) and the
/// log midpoint is sqrt(2) * down, which no float holds; the float nearest to it (1.41421354f *
/// down, just below; among subnormals, the nearest subnormal) counts as the tie, so a rule's
/// sqrt(2) (as sqrt(sa^2 + sb^2) for equal scales, or 2 * sqrt(2) for K = 8) rounds up, as
/// documented. Above 2^127 the answer is 2^127 (2^128 is not a float).
[[nodiscard]] inline float pow2_round_nearest(float s) noexcept
{
    constexpr float sqrt2 = 1.41421356237309504880f;
    const float down = pow2_round_down(s);
    if (s == down) return s;
    const float tie = down * sqrt2;  // rounded like any float result: the float nearest sqrt(2) * down
    return s >= tie && down < std::numeric_limits<float>::max() / 2.0f ? 2.0f * down : down;
}

inline float pow2_scale::from_rule(float scale) noexcept
{
    if (scale == 0.0f || !std::isfinite(scale)) return scale;
    return pow2_round_nearest(scale);
}

namespace detail {

/// A scale as Policy stores it, or scale_error naming the value and where it came from.
template <ScalePolicy Policy>
[[nodiscard]] float checked_scale(float scale, const char* where)
{
    if (std::isnan(scale) || std::isinf(scale) || scale < 0.0f) {
        SCALIFY_THROW(scale_error(fmt::format("{}: scale must be finite and >= 0, got {}", where, scale)));
    }
    if constexpr (Policy::power_of_two) {
        if (!is_pow2_or_zero(scale)) {
            SCALIFY_THROW(scale_error(fmt::format(
                "{}: pow2_scale needs 0 or a power of two, got {} (round it with pow2_round_nearest/up/down)",
                where, scale)));
        }
    }
    return scale == 0.0f ? 0.0f : scale;  // -0 -> +0
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// ScaledArray

template <ScaledElement T, ScalePolicy Policy = float_scale>
class ScaledArray {
public:
    using value_type = T;
    using scale_policy = Policy;
    using data_type = xt::xarray<T>;
    using shape_type = typename data_type::shape_type;

    /// An empty (0-d zero-size) array with scale 1.
    ScaledArray() = default;

    /// data * scale; scale_error for a negative, NaN or infinite scale (and, under pow2_scale,
    /// one that is not a power of two).
    ScaledArray(data_type data, float scale)
        : m_data(std::move(data)), m_scale(detail::checked_scale<Policy>(scale, "ScaledArray"))
    {
    }

    [[nodiscard]] const data_type& data() const noexcept { return m_data; }
    [[nodiscard]] float scale() const noexcept { return m_scale; }
    [[nodiscard]] const shape_type& shape() const noexcept { return m_data.shape(); }
    [[nodiscard]] std::size_t size() const noexcept { return m_data.size(); }
    [[nodiscard]] std::size_t dimension() const noexcept { return m_data.dimension(); }

    /// data * scale, computed in compute_t<T> (float, or double for double data). A zero scale
    /// gives zeros even where the data holds inf or NaN.
    [[nodiscard]] xt::xarray<compute_t<T>> value() const
    {
        using C = compute_t<T>;
        xt::xarray<C> out = xt::xarray<C>::from_shape(m_data.shape());
        const T* in = m_data.data();
        C* o = out.data();
        const std::size_t n = m_data.size();
        if (m_scale == 0.0f) {
            for (std::size_t i = 0; i < n; ++i) o[i] = C(0);
        } else {
            const C s = static_cast<C>(m_scale);
            for (std::size_t i = 0; i < n; ++i) o[i] = detail::load(in[i]) * s;
        }
        return out;
    }

    /// Moves the data out (the array is left empty), e.g. to hand its memory to the next result:
    /// `c = matmul(a, b, std::move(c).release_data())`.
    [[nodiscard]] data_type release_data() && noexcept { return std::move(m_data); }

    /// The same value under another element type is cast<U>(...); under another policy this:
    /// a float_scale array converts to pow2_scale only if its scale already is a power of two.
    template <ScalePolicy Other>
    [[nodiscard]] ScaledArray<T, Other> with_policy() const
    {
        return ScaledArray<T, Other>(m_data, m_scale);
    }

private:
    data_type m_data{};
    float m_scale = 1.0f;
};

/// ScaledArray from data and scale, policy named first: make_scaled_array<pow2_scale>(data, 0.25f).
template <ScalePolicy Policy = float_scale, ScaledElement T>
[[nodiscard]] ScaledArray<T, Policy> make_scaled_array(xt::xarray<T> data, float scale)
{
    return ScaledArray<T, Policy>(std::move(data), scale);
}

/// Data as they are, scale 1 (exact under both policies).
template <ScalePolicy Policy = float_scale, ScaledElement T>
[[nodiscard]] ScaledArray<T, Policy> as_scaled_array(xt::xarray<T> data)
{
    return ScaledArray<T, Policy>(std::move(data), 1.0f);
}

template <class A>
inline constexpr bool is_scaled_array_v = false;
template <class T, class P>
inline constexpr bool is_scaled_array_v<ScaledArray<T, P>> = true;

/// Any ScaledArray specialisation.
template <class A>
concept AnyScaledArray = is_scaled_array_v<std::remove_cvref_t<A>>;

namespace detail {
/// The integers of `values` with `separator` between them ("2, 3", "128x784"), for messages and
/// reports. Appended piece by piece: "literal" + std::to_string(...) draws GCC 12's false
/// -Wrestrict warning (GCC PR 105651) where it is inlined into optimised code.
template <class Integers>
[[nodiscard]] std::string joined(const Integers& values, std::string_view separator)
{
    std::string out;
    for (const auto value : values) {
        if (!out.empty()) out += separator;
        out += std::to_string(value);
    }
    return out;
}
}  // namespace detail

/// "(2, 3)" for messages.
template <class Shape>
[[nodiscard]] std::string shape_string(const Shape& shape)
{
    std::string out = "(";
    out += detail::joined(shape, ", ");
    out += shape.size() == 1 ? ",)" : ")";
    return out;
}

}  // namespace scalify
