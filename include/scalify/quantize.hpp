#pragma once
/// \file quantize.hpp
/// quantize<T>(x): the first thing to reach for. A float array becomes low-precision data T plus
/// a scale chosen from x's largest finite magnitude, so x's range fills T's; dequantize(q) (or
/// q.value()) gives the values back. A block layout as second argument gives block scales.
///
///     auto q = quantize<float8_e4m3fn>(x);                     // pow2 scale, nearest-even, satfinite
///     auto f = quantize<float8_e4m3fn, float_scale>(x);        // float32 scale amax / 448
///     auto s = quantize<float8_e5m2, pow2_scale, round_stochastic>(x, seed);
///     auto mx = quantize<float8_e4m3fn>(x, mx_blocks{.axis = 1});   // OCP MX, 32-element E8M0 blocks
///     auto b = quantize<float8_e4m3fn>(x, per_block{1, 128});        // float32 scale per 1x128 block
///     xt::xarray<float> back = q.value();                    // or dequantize(q): float, scale 1
///
/// Per tensor, the multiplier q = max(T) / amax (torchao tensorwise), rounded down to a power of
/// two under pow2_scale so that no finite element saturates; the result's scale is 1 / q.
/// Non-finite input: the scale comes from the finite elements alone, so one NaN or inf does not
/// cost the others their precision; NaN stays NaN, +-inf becomes +-max(T) under saturate_finite
/// (the default) and T's inf (NaN where T has none) under no_saturation. No finite non-zero
/// element: scale 1. (as_scaled_array(x), by contrast, keeps scale 1 whatever x holds.)

#include <scalify/block/quantize.hpp>
#include <scalify/detail/parallel.hpp>
#include <scalify/dist/reducer.hpp>
#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/non_finite.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

namespace scalify {

/// Block layouts for quantize<T>(x, layout); each names the block quantiser it calls.
/// per_block{rows, cols}: float32 scale amax / max(T) per rows x cols block (quantize_blocks).
struct per_block {
    std::size_t rows = 1;
    std::size_t cols = 128;
};
/// per_axis{axis}: one float32 scale per row (axis 1) or per column (axis 0) (quantize_axiswise).
struct per_axis {
    std::size_t axis = 1;
};
/// mx_blocks{axis, size, rule}: OCP Microscaling, E8M0 scale per `size` elements along `axis`
/// (quantize_mx).
struct mx_blocks {
    std::size_t axis = 1;
    std::size_t size = 32;
    mx_scale_rule rule = mx_scale_rule::floor;
};

namespace detail {

/// Largest finite |x| (NaN and inf skipped: strategy/non_finite.hpp), agreed over the ranks of
/// dist::current_reducer(). In the checked mode a NaN or inf in x throws, naming `op`.
template <class U>
[[nodiscard]] float finite_amax(const char* op, const U* x, std::size_t n)
{
    const float amax = finite_amax_in<float>(op, x, n);  // in float, as the cast multiplies
    return static_cast<float>(dist::current_reducer().max(static_cast<double>(amax)));
}

/// max(T) / amax, rounded down to a power of two for a pow2 scale; 1 without a finite non-zero
/// amax. A multiplier that overflows float32 (tiny amax) is clamped to the largest power of two.
template <class T, bool PowerOfTwo>
[[nodiscard]] float amax_multiplier(float amax) noexcept
{
    if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
    const double q = static_cast<double>(std::numeric_limits<T>::max()) / static_cast<double>(amax);
    const float clamped = q < 0x1p127 ? static_cast<float>(q) : 0x1p127f;
    return PowerOfTwo ? pow2_round_down(clamped) : clamped;
}

/// x * q, cast to T with the given rounding and saturation (seed used by stochastic rounding only).
template <class T, class Rounding, class Saturation, class U>
[[nodiscard]] xt::xarray<T> cast_multiplied(const xt::xarray<U>& x, float q, std::uint64_t seed)
{
    xt::xarray<T> data = xt::xarray<T>::from_shape(x.shape());
    const U* in = x.data();
    T* out = data.data();
    parallel_ranges(x.size(), [=](std::size_t, std::size_t begin, std::size_t end) {
        constexpr std::size_t chunk = 1024;  // the multiplied floats stay in L1 between the two loops
        float scaled[chunk];
        for (std::size_t first = begin; first < end; first += chunk) {
            const std::size_t count = std::min(chunk, end - first);
            for (std::size_t i = 0; i < count; ++i) scaled[i] = static_cast<float>(load(in[first + i])) * q;
            const std::span<const float> from(scaled, count);
            const std::span<T> to(out + first, count);
            if constexpr (StochasticRounding<Rounding>) {
                convert_n<T, Rounding, Saturation>(from, to, seed, first);
            } else {
                convert_n<T, Rounding, Saturation>(from, to);
            }
        }
    });
    return data;
}

template <class T, class Policy, class Rounding, class Saturation, class U>
[[nodiscard]] ScaledArray<T, Policy> quantize_per_tensor(const xt::xarray<U>& x, std::uint64_t seed)
{
    const float q = amax_multiplier<T, Policy::power_of_two>(finite_amax("quantize", x.data(), x.size()));
    return ScaledArray<T, Policy>(cast_multiplied<T, Rounding, Saturation>(x, q, seed), 1.0f / q);
}

}  // namespace detail

/// x as T data with a per-tensor scale from its largest finite magnitude (see the file comment).
/// U: float, double, a minifloat, Eigen::half or Eigen::bfloat16.
template <EncodedFloat T, ScalePolicy Policy = pow2_scale, RoundingPolicy Rounding = round_nearest_even,
          SaturationPolicy Saturation = saturate_finite, class U>
    requires DeterministicRounding<Rounding>
[[nodiscard]] ScaledArray<T, Policy> quantize(const xt::xarray<U>& x)
{
    return detail::quantize_per_tensor<T, Policy, Rounding, Saturation>(x, 0);
}

/// Stochastic rounding: element i rounds with the counter-based random bits at (seed, i), so the
/// result depends on the data and the seed only, not on the thread count.
template <EncodedFloat T, ScalePolicy Policy = pow2_scale, RoundingPolicy Rounding = round_stochastic,
          SaturationPolicy Saturation = saturate_finite, class U>
    requires StochasticRounding<Rounding>
[[nodiscard]] ScaledArray<T, Policy> quantize(const xt::xarray<U>& x, std::uint64_t seed)
{
    return detail::quantize_per_tensor<T, Policy, Rounding, Saturation>(x, seed);
}

/// A scaled array re-quantised from its values (e.g. float32 activations to fp8, or an fp8
/// tensor to another format); the input's scale does not constrain the new one.
template <EncodedFloat T, ScalePolicy Policy = pow2_scale, RoundingPolicy Rounding = round_nearest_even,
          SaturationPolicy Saturation = saturate_finite, class U, class P>
    requires DeterministicRounding<Rounding>
[[nodiscard]] ScaledArray<T, Policy> quantize(const ScaledArray<U, P>& x)
{
    return quantize<T, Policy, Rounding, Saturation>(x.value());
}

/// Block-scaled quantisation of a 2-D float array (docs/block_scaling.md).
template <EncodedFloat T>
[[nodiscard]] BlockScaledArray<T, float> quantize(const xt::xarray<float>& x, per_block layout)
{
    return quantize_blocks<T>(x, layout.rows, layout.cols);
}

template <EncodedFloat T>
[[nodiscard]] BlockScaledArray<T, float> quantize(const xt::xarray<float>& x, per_axis layout)
{
    return quantize_axiswise<T>(x, layout.axis);
}

template <EncodedFloat T>
[[nodiscard]] BlockScaledArray<T, float8_e8m0fnu> quantize(const xt::xarray<float>& x, mx_blocks layout)
{
    return quantize_mx<T>(x, layout.axis, layout.size, layout.rule);
}

/// The values a quantised array stands for, as a float scaled array of scale 1 (its data() are
/// the values; ops take it as they take any array), like dequantize of a BlockScaledArray.
template <class T, class P>
[[nodiscard]] ScaledArray<compute_t<T>, float_scale> dequantize(const ScaledArray<T, P>& q)
{
    return ScaledArray<compute_t<T>, float_scale>(q.value(), 1.0f);
}

}  // namespace scalify
