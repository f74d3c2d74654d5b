#pragma once
/// \file counter_random.hpp
/// A counter-based random generator: the bits for element i depend only on (seed, i), so
/// stochastic rounding gives the same result however a loop is chunked or threaded.

#include <cstdint>

namespace scalify::detail {

/// A bijective 32-bit mixer with low bias (the "lowbias32" constants of C. Wellons' hash prospector).
[[nodiscard]] constexpr std::uint32_t mix32(std::uint32_t x) noexcept
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/// SplitMix64's finaliser, used once per seed to derive the round keys.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t x) noexcept
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

class counter_random {
public:
    explicit constexpr counter_random(std::uint64_t seed) noexcept
        : m_key_low(static_cast<std::uint32_t>(mix64(seed))), m_key_high(static_cast<std::uint32_t>(mix64(seed) >> 32))
    {}

    /// 32 random bits for element `index` (two rounds of mix32 keyed by the seed).
    [[nodiscard]] constexpr std::uint32_t operator()(std::uint64_t index) const noexcept
    {
        return block(static_cast<std::uint32_t>(index >> 32))(static_cast<std::uint32_t>(index));
    }

    /// The generator restricted to indices that share their upper 32 bits: a cheap inner loop.
    struct block_generator {
        std::uint32_t key_low;
        std::uint32_t key_high;
        [[nodiscard]] constexpr std::uint32_t operator()(std::uint32_t low_index) const noexcept
        {
            return mix32(mix32(low_index ^ key_low) + key_high);
        }
    };
    [[nodiscard]] constexpr block_generator block(std::uint32_t high_index) const noexcept
    {
        return {m_key_low, mix32(high_index ^ m_key_high)};
    }

private:
    std::uint32_t m_key_low;
    std::uint32_t m_key_high;
};

}  // namespace scalify::detail
