#pragma once
/// \file recipe.hpp
/// The low-precision matmul recipe of a differentiable computation, chosen around the model
/// instead of inside it (TransformerEngine's fp8_autocast, in scalify's terms): within a
/// matmul_precision_scope every differentiable matmul casts both operands to the forward type
/// (nearest even, saturating to the largest finite value, at the operands' propagated scales:
/// no amax is measured) and the cotangent that reaches the product to the gradient type
/// (cast_grad). Scales keep propagating through every op, forward and backward; the product is
/// stored in the type it has without the scope (and so are the gradient products), so the
/// model's types do not change.
///
///     ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
///     auto [loss, grads] = ad::value_and_grad<unit_scaling>(model, params);
///
/// The setting is per thread, nests, and is restored by the scope's destructor (also when an
/// exception leaves the scope).

#include <scalify/amp/any_scaled_array.hpp>
#include <scalify/detail/parallel.hpp>
#include <scalify/detail/scoped_setting.hpp>
#include <scalify/dist/reducer.hpp>
#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/minifloat.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>

#include <cmath>
#include <limits>
#include <span>

namespace scalify::ad {

/// Where the casts of a recipe put the data relative to the target format's range.
enum class cast_scaling {
    propagated,  ///< at the scale the value carries (scalify's method: no measurement)
    current,     ///< after rescaling so the data's amax maps to the format's largest value (per-tensor current scaling)
    unscaled,    ///< after moving the whole scale into the data (scale 1): plain low-precision arithmetic
};

/// The types of a differentiable matmul's operands (forward) and of the cotangent reaching it
/// (gradient), float32 meaning no cast, and how the casts are scaled.
struct matmul_precision {
    dtype forward = dtype::float32;
    dtype gradient = dtype::float32;
    cast_scaling scaling = cast_scaling::propagated;

    friend bool operator==(const matmul_precision&, const matmul_precision&) = default;
};

/// The recipe off: float32 operands forward and backward (what a thread runs outside any scope).
inline constexpr matmul_precision full_precision{};

namespace detail {
inline matmul_precision& matmul_precision_state() noexcept
{
    thread_local matmul_precision state{};
    return state;
}

/// The power of two a cast to a format whose largest finite value is format_max moves, under
/// `scaling`, from the data into the scale (see cast_scaling); 1 when nothing moves: propagated
/// scaling, an all-zero, zero-scale or non-finite array, or a factor the scale cannot take. One
/// compiled copy per array type, whatever the format.
template <class T, ScalePolicy P>
[[nodiscard]] float rescale_power_for_cast(const ScaledArray<T, P>& a, cast_scaling scaling, double format_max)
{
    if (scaling == cast_scaling::propagated) return 1.0f;
    double factor = 0.0;
    if (scaling == cast_scaling::unscaled) {
        if (a.scale() == 0.0f) return 1.0f;
        factor = 1.0 / double(a.scale());
    } else {
        // The amax of every rank (dist::current_reducer()): all ranks cast under one scale. Every
        // rank takes part, a zero-scale array too.
        // The finite elements' amax (strategy/non_finite.hpp).
        double amax = 0.0;
        if (a.scale() != 0.0f) {
            amax = scalify::detail::finite_amax_in<double>("matmul_precision_scope's cast", a.data().data(), a.size(), a.scale());
        }
        amax = dist::detail::global_data_amax(amax, double(a.scale()));
        if (a.scale() == 0.0f || !(amax > 0.0) || !std::isfinite(amax)) return 1.0f;
        factor = amax / format_max;
    }
    const float pow2 = pow2_round_up(static_cast<float>(factor));
    if (!(pow2 > 0.0f) || !std::isfinite(pow2) || !(double(a.scale()) * pow2 <= double(std::numeric_limits<float>::max()))) {
        return 1.0f;
    }
    return pow2;
}

/// rescale_power_for_cast for a cast to F.
template <ScaledElement F, class T, ScalePolicy P>
[[nodiscard]] float rescale_power_for_cast(const ScaledArray<T, P>& a, cast_scaling scaling)
{
    return rescale_power_for_cast(a, scaling, double(std::numeric_limits<F>::max()));
}

/// The same value as `a`, rebalanced for a cast under `scaling` to a format whose largest finite
/// value is format_max (see cast_scaling). The factor is a power of two, so nothing rounds.
template <class T, ScalePolicy P>
[[nodiscard]] ScaledArray<T, P> rescale_for_cast(const ScaledArray<T, P>& a, cast_scaling scaling, double format_max)
{
    const float pow2 = rescale_power_for_cast(a, scaling, format_max);
    return pow2 == 1.0f ? a : scalify::rebalance_scale(a, pow2);
}

/// rescale_for_cast for a cast to F.
template <ScaledElement F, class T, ScalePolicy P>
[[nodiscard]] ScaledArray<T, P> rescale_for_cast(const ScaledArray<T, P>& a, cast_scaling scaling)
{
    return rescale_for_cast(a, scaling, double(std::numeric_limits<F>::max()));
}

/// cast<F> (nearest even, saturating) of rescale_for_cast<F>(a, scaling), without copying `a`
/// when nothing is rebalanced (the propagated recipe: every cast of a training step).
template <ScaledElement F, class T, ScalePolicy P>
[[nodiscard]] ScaledArray<F, P> recipe_cast_array(const ScaledArray<T, P>& a, cast_scaling scaling)
{
    const float pow2 = rescale_power_for_cast<F>(a, scaling);
    if (pow2 == 1.0f) return scalify::cast<F, round_nearest_even, saturate_finite>(a);
    return scalify::cast<F, round_nearest_even, saturate_finite>(scalify::rebalance_scale(a, pow2));
}

/// recipe_cast_array's values held as float32 (exact: every value of F is a float32), as the
/// precision scope's products take them. A float32 array cast to an fp8 format is rounded in
/// one pass (fake_quantize_n, tested equal to the cast for every input), without the F array.
template <ScaledElement F, class T, ScalePolicy P>
[[nodiscard]] ScaledArray<float, P> recipe_grid_array(const ScaledArray<T, P>& a, cast_scaling scaling)
{
    if constexpr (Minifloat<F> && std::same_as<T, float>) {
        const float pow2 = rescale_power_for_cast<F>(a, scaling);
        ScaledArray<float, P> rebalanced;
        if (pow2 != 1.0f) rebalanced = scalify::rebalance_scale(a, pow2);
        const ScaledArray<float, P>& source = pow2 == 1.0f ? a : rebalanced;
        xt::xarray<float> data = xt::xarray<float>::from_shape(source.shape());
        const float* in = source.data().data();
        float* out = data.data();
        scalify::detail::parallel_ranges(source.size(), [in, out](std::size_t, std::size_t begin, std::size_t end) {
            fake_quantize_n<F, round_nearest_even, saturate_finite>(std::span<const float>(in + begin, end - begin),
                                                                    std::span<float>(out + begin, end - begin));
        });
        return ScaledArray<float, P>(std::move(data), source.scale());
    } else {
        return scalify::cast<float>(recipe_cast_array<F>(a, scaling));
    }
}

}  // namespace detail

/// This thread's matmul recipe (float32 / float32 outside any scope).
[[nodiscard]] inline matmul_precision current_matmul_precision() noexcept { return detail::matmul_precision_state(); }

/// Sets this thread's matmul recipe for the scope's lifetime.
///     ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
///     ad::matmul_precision_scope eval(ad::full_precision);             // off again, e.g. to evaluate
///     ad::matmul_precision_scope maybe(use_fp8 ? fp8_recipe : ad::full_precision);
class matmul_precision_scope {
public:
    matmul_precision_scope(dtype forward, dtype gradient, cast_scaling scaling = cast_scaling::propagated) noexcept
        : matmul_precision_scope(matmul_precision{forward, gradient, scaling})
    {
    }
    explicit matmul_precision_scope(matmul_precision recipe) noexcept : m_recipe(detail::matmul_precision_state(), recipe) {}

private:
    scalify::detail::scoped_setting<matmul_precision> m_recipe;
};

}  // namespace scalify::ad
