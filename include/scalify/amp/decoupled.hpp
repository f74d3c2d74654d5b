#pragma once
/// \file decoupled.hpp
/// The great decoupling (seed 000): under pow2_scale the storage type no longer fixes the compute
/// type. decoupled_exp of fp16 data looks at the value range, scale * max|data|, and
///  - computes in fp16 when e^(that) stays below fp16's max: the argument d * scale is exact in
///    fp16 (a power-of-two scale), the exponential is rounded once to fp16, scale 1;
///  - else computes in float32 and stores fp16 data under a power-of-two scale that keeps the
///    largest result in range (the decoupling: float32 compute, fp16 storage).
/// The choice is counted in a thread-local trace so callers and tests can observe it.

#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/scaled_array.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace scalify {

struct decoupling_trace {
    std::size_t low_precision = 0;  ///< runs computed in the storage type
    std::size_t float32 = 0;        ///< runs computed in float32
};

/// This thread's counts since the last reset.
[[nodiscard]] inline decoupling_trace& decoupling_counts() noexcept
{
    thread_local decoupling_trace trace;
    return trace;
}

/// e^a for fp16 data under pow2_scale, compute type chosen from the scale (see file comment).
template <ScalePolicy Policy>
[[nodiscard]] ScaledArray<Eigen::half, pow2_scale> decoupled_exp(const ScaledArray<Eigen::half, Policy>& a)
{
    static_assert(Policy::power_of_two,
                  "decoupled_exp needs a pow2_scale array: only a power-of-two scale makes data * scale exact in fp16 "
                  "(convert with with_policy<pow2_scale>() after rounding the scale)");
    float amax = 0.0f;
    for (const auto& x : a.data()) {
        const float m = std::abs(static_cast<float>(x));
        amax = m > amax ? m : amax;  // NaN ignored
    }
    const double top = static_cast<double>(amax) * a.scale();
    const double half_max_log = std::log(static_cast<double>(static_cast<float>(std::numeric_limits<Eigen::half>::max())));
    xt::xarray<Eigen::half> data = xt::xarray<Eigen::half>::from_shape(a.shape());
    const Eigen::half* in = a.data().data();
    Eigen::half* out = data.data();
    const std::size_t n = a.size();
    if (top < half_max_log) {
        ++decoupling_counts().low_precision;
        const Eigen::half s(a.scale());  // a power of two in fp16's range here, since top is small
        for (std::size_t i = 0; i < n; ++i) out[i] = Eigen::half_impl::exp(a.scale() == 0.0f ? Eigen::half(0.0f) : in[i] * s);
        return ScaledArray<Eigen::half, pow2_scale>(std::move(data), 1.0f);
    }
    ++decoupling_counts().float32;
    // Largest result e^top, stored as fp16 data <= max(fp16) / 2 under scale 2^ceil(top / ln 2 - 15).
    // Past 2^127 no float scale can hold it: the data then overflow to inf, as float32 exp would.
    const double wanted = std::exp(std::min(top - half_max_log + std::log(2.0), 88.0));
    const float scale = pow2_round_up(static_cast<float>(wanted));
    const double log_scale = std::log(static_cast<double>(scale));
    for (std::size_t i = 0; i < n; ++i) {
        const double v = static_cast<double>(static_cast<float>(in[i])) * a.scale();
        out[i] = Eigen::half(static_cast<float>(std::exp(static_cast<float>(v - log_scale))));
    }
    return ScaledArray<Eigen::half, pow2_scale>(std::move(data), scale);
}

}  // namespace scalify
