#pragma once
/// \file train/autoscale/statistics.hpp
/// What AutoScale measures: the norm (RMS, standard deviation or amax) of an op's data with its
/// saturated and non-finite counts, over every rank of dist::current_reducer(); and the
/// saturating cast a measured op stores its result with.

#include <scalify/amp/any_scaled_array.hpp>
#include <scalify/dist/reducer.hpp>
#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/numeric/minifloat.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/train/autoscale/report.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

namespace scalify::autoscale {

// ---------------------------------------------------------------------------------------------
// Statistics

namespace detail {

struct data_statistic {
    double norm = 0.0;
    std::size_t count = 0;
    std::size_t non_finite = 0;
    std::size_t saturated = 0;  ///< |x| >= the saturation bound
};

/// norm of the finite elements; saturated counts |x| >= bound. Over every rank of
/// dist::current_reducer().
template <class T>
[[nodiscard]] data_statistic measure(const xt::xarray<T>& data, norm_kind kind, double bound)
{
    data_statistic s;
    double sum = 0.0, sum_sq = 0.0, amax = 0.0;
    std::size_t finite = 0;
    const T* p = data.data();
    const std::size_t n = data.size();
    s.count = n;
    for (std::size_t i = 0; i < n; ++i) {
        const double v = static_cast<double>(scalify::detail::load(p[i]));
        if (!std::isfinite(v)) {
            ++s.non_finite;
            continue;
        }
        ++finite;
        sum += v;
        sum_sq += v * v;
        const double m = std::abs(v);
        amax = m > amax ? m : amax;
        s.saturated += m >= bound ? 1 : 0;
    }
    // Over every rank of dist::current_reducer(): every rank measures the global tensor and keeps
    // the same multiplier (the ranks' scales agree, since every scale decision is reduced).
    double count = static_cast<double>(finite);
    if (dist::reducer& world = dist::current_reducer(); world.size() > 1) {
        double sums[] = {sum, sum_sq, count, static_cast<double>(n), static_cast<double>(s.non_finite),
                         static_cast<double>(s.saturated)};
        world.sum(sums);
        amax = world.max(amax);
        sum = sums[0], sum_sq = sums[1], count = sums[2];
        s.count = static_cast<std::size_t>(sums[3]);
        s.non_finite = static_cast<std::size_t>(sums[4]);
        s.saturated = static_cast<std::size_t>(sums[5]);
    }
    if (count == 0.0) return s;
    switch (kind) {
    case norm_kind::rms: s.norm = std::sqrt(sum_sq / count); break;
    case norm_kind::stddev: {
        const double mean = sum / count;
        s.norm = std::sqrt(std::max(0.0, sum_sq / count - mean * mean));
        break;
    }
    case norm_kind::amax: s.norm = amax; break;
    }
    return s;
}

/// A measured multiplier that float32 can hold as a positive normal-or-subnormal number.
[[nodiscard]] inline bool usable(double m) noexcept
{
    return m > 0.0 && static_cast<float>(m) > 0.0f && std::isfinite(static_cast<float>(m));
}

/// The largest finite value of T, or +inf for float/double (which do not saturate here).
template <ScaledElement T>
[[nodiscard]] double saturation_bound() noexcept
{
    if constexpr (std::same_as<T, float> || std::same_as<T, double>) return std::numeric_limits<double>::infinity();
    else return static_cast<double>(static_cast<float>(std::numeric_limits<T>::max()));
}

/// Float data into Out, rounding to nearest even and saturating (finite overflow clamps to max).
template <ScaledElement Out, ScalePolicy P>
[[nodiscard]] ScaledArray<Out, P> saturating_cast(ScaledArray<float, P>&& a)
{
    if constexpr (std::same_as<Out, float>) return std::move(a);
    else return cast<Out, round_nearest_even, saturate_finite>(a);
}

}  // namespace detail

}  // namespace scalify::autoscale
