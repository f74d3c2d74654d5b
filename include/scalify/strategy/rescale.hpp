#pragma once
/// \file rescale.hpp
/// Dynamic rescale ops (jax-scalify's dynamic_rescale_*): move the magnitude of a ScaledArray's
/// data into its scale so that the data's max / mean |.| / RMS becomes about 1. The factor is a
/// power of two (nearest in log2), so the value is unchanged exactly, under both policies,
/// barring data underflow. A statistic below `epsilon` is raised to it (so near-zero data are
/// not blown up). The statistic is that of the finite elements (strategy/non_finite.hpp): a NaN
/// or inf does not move the scale; no finite non-zero element, or a zero scale, leaves the array
/// as it is.
///
///     auto g = dynamic_rescale_l2(grad);   // RMS(data) ~ 1

#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/non_finite.hpp>

#include <cmath>

namespace scalify {

namespace detail {

enum class rescale_norm { max, l1, l2 };

template <rescale_norm Norm, class T, class P>
[[nodiscard]] ScaledArray<T, P> dynamic_rescale(const ScaledArray<T, P>& a, float epsilon)
{
    constexpr const char* op = Norm == rescale_norm::max  ? "dynamic_rescale_max"
                               : Norm == rescale_norm::l1 ? "dynamic_rescale_l1"
                                                          : "dynamic_rescale_l2";
    if (a.scale() == 0.0f || a.size() == 0) return a;
    const finite_summary s = summarize_for_scale(op, a.data().data(), a.size(), a.scale());
    double statistic = Norm == rescale_norm::max ? s.amax : Norm == rescale_norm::l1 ? s.mean_abs() : s.rms();
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
