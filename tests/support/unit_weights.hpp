#pragma once
// Unit-variance weight data for the unit-scaling chains of tests/unit/test_unit_scaling.cpp and
// tools/unit_scaling_report.cpp: uniform on +-sqrt(3), counter-based (cheap, reproducible, and a
// layer can be regenerated instead of held), at scale 1/sqrt(fan_in).
#include <scalify/scalify.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace scalify::testing {

template <class Policy>
scalify::ScaledArray<float, Policy> unit_weights(std::uint64_t seed, std::size_t fan_in, std::size_t fan_out)
{
    const auto bits = scalify::detail::counter_random(seed).block(0);
    xt::xarray<float> data = xt::xarray<float>::from_shape({fan_in, fan_out});
    for (std::size_t i = 0; i < data.size(); ++i) {
        data.data()[i] = (static_cast<float>(bits(static_cast<std::uint32_t>(i))) * 0x1p-32f * 2.0f - 1.0f) * 1.7320508f;
    }
    return scalify::ScaledArray<float, Policy>(std::move(data), 1.0f / std::sqrt(static_cast<float>(fan_in)));
}

}  // namespace scalify::testing
