#pragma once
/// \file train/autoscale/held_scaling.hpp
/// The scaling strategy a scaling_context runs each primitive under: output scale = natural scale x
/// the multiplier the context holds for the op (held_scaling), and the tag apply() hands a
/// primitive (strategy_tag).

#include <scalify/strategy/scaling.hpp>

#include <limits>

namespace scalify::autoscale {

/// Passed to a primitive run through apply(): the scaling strategy it must use.
template <class S>
struct strategy_tag {
    using type = S;
};

// ---------------------------------------------------------------------------------------------
// The held-multiplier scaling strategy

namespace detail {

struct held_state {
    double multiplier = 1.0;
    float natural = std::numeric_limits<float>::quiet_NaN();
};

[[nodiscard]] inline held_state& held() noexcept
{
    thread_local held_state state;
    return state;
}

/// Sets the multiplier held_scaling applies for the current thread; restores the previous one.
class held_guard {
public:
    explicit held_guard(double multiplier) noexcept : m_saved(held())
    {
        held().multiplier = multiplier;
        held().natural = std::numeric_limits<float>::quiet_NaN();
    }
    ~held_guard() { held() = m_saved; }
    held_guard(const held_guard&) = delete;
    held_guard& operator=(const held_guard&) = delete;

private:
    held_state m_saved;
};

}  // namespace detail

/// A scalify scaling strategy: output scale = natural * the multiplier set for this thread by the
/// context running the op (1 outside one). Records the natural scale it was asked about.
struct held_scaling {
    static constexpr bool needs_amax = false;
    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op, const scale_request& request) noexcept
    {
        detail::held().natural = request.natural;
        return Policy::from_rule(static_cast<float>(double(request.natural) * detail::held().multiplier));
    }
};
static_assert(ScalingStrategy<held_scaling>);

}  // namespace scalify::autoscale
