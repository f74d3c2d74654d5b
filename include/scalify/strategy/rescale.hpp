#pragma once
/// \file rescale.hpp
/// Dynamic rescale ops (jax-scalify's dynamic_rescale_*): move the magnitude of a ScaledArray's
/// data into its scale so that the data's max / mean |.| / RMS becomes about 1. The factor is a
/// power of two (nearest in log2), so the value is unchanged exactly, under both policies,
/// barring data underflow. A statistic below `epsilon` is raised to it (so near-zero data are
/// not blown up); an all-zero, zero-scale or non-finite statistic leaves the array as it is.
///
///     auto g = dynamic_rescale_l2(grad);   // RMS(data) ~ 1

#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>

#include <cmath>

namespace scalify {

namespace detail {

enum class rescale_norm { max, l1, l2 };

template <rescale_norm Norm, class T, class P>
[[nodiscard]] ScaledArray<T, P> dynamic_rescale(const ScaledArray<T, P>& a, float epsilon)
{
    if (a.scale() == 0.0f || a.size() == 0) return a;
    double statistic = 0.0;
    for (const auto& x : a.data()) {
        const double v = std::abs(static_cast<double>(load(x)));
        if constexpr (Norm == rescale_norm::max) statistic = v > statistic ? v : statistic;
        else if constexpr (Norm == rescale_norm::l1) statistic += v;
        else statistic += v * v;
    }
    if constexpr (Norm == rescale_norm::l1) statistic /= static_cast<double>(a.size());
    if constexpr (Norm == rescale_norm::l2) statistic = std::sqrt(statistic / static_cast<double>(a.size()));
    if (!(statistic > 0.0) || !std::isfinite(statistic)) return a;
    statistic = std::max(statistic, static_cast<double>(epsilon));
    const float factor = pow2_round_nearest(static_cast<float>(statistic));
    const double scale = static_cast<double>(a.scale()) * factor;
    if (!(scale <= static_cast<double>(std::numeric_limits<float>::max())) || !(scale >= std::numeric_limits<float>::denorm_min())) {
        return a;  // the scale cannot take the factor: keep the array as it is
    }
    return rebalance_scale(a, factor);
}

}  // namespace detail

/// Data max |.| -> ~1.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> dynamic_rescale_max(const ScaledArray<T, P>& a, float epsilon = 1e-30f)
{
    return detail::dynamic_rescale<detail::rescale_norm::max>(a, epsilon);
}
/// Data mean |.| -> ~1.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> dynamic_rescale_l1(const ScaledArray<T, P>& a, float epsilon = 1e-30f)
{
    return detail::dynamic_rescale<detail::rescale_norm::l1>(a, epsilon);
}
/// Data RMS -> ~1.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> dynamic_rescale_l2(const ScaledArray<T, P>& a, float epsilon = 1e-30f)
{
    return detail::dynamic_rescale<detail::rescale_norm::l2>(a, epsilon);
}

}  // namespace scalify
