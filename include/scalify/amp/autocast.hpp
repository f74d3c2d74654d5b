#pragma once
/// \file autocast.hpp
/// Runtime mixed-precision scope: an RAII guard, thread-local and nestable, that turns the
/// mixed-precision ops of <scalify/amp/policy.hpp> on or off, restored on scope exit (exceptions
/// included); and function wrappers that cast at a region's boundary so low precision does not
/// bleed out of it.
///
///     {
///         autocast on;                       // enabled in this thread
///         auto y = amp<half_policy>::matmul(x, w);
///         { autocast off(false); ... }       // a float32 region inside
///     }
///     auto safe = float32_fn([](const auto& x) { return amp<half_policy>::exp(x); });

#include <scalify/amp/any_scaled_array.hpp>
#include <scalify/detail/scoped_setting.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>

#include <tuple>
#include <type_traits>
#include <utility>

namespace scalify {

namespace detail {
inline bool& autocast_flag() noexcept
{
    thread_local bool enabled = false;
    return enabled;
}
}  // namespace detail

/// Whether mixed precision is on in this thread (off outside any autocast scope).
[[nodiscard]] inline bool autocast_enabled() noexcept { return detail::autocast_flag(); }

/// Sets the thread's autocast state for its lifetime; the previous state returns on destruction.
class autocast {
public:
    explicit autocast(bool enabled = true) noexcept : m_enabled(detail::autocast_flag(), enabled) {}

private:
    detail::scoped_setting<bool> m_enabled;
};

namespace detail {

template <class X>
inline constexpr bool is_any_scaled_array_v = false;
template <class P>
inline constexpr bool is_any_scaled_array_v<any_scaled_array<P>> = true;

/// A ScaledArray or any_scaled_array as float data (same scale); anything else as it is.
template <class X>
[[nodiscard]] auto to_float_boundary(X&& x)
{
    using plain = std::remove_cvref_t<X>;
    if constexpr (AnyScaledArray<plain>) {
        return cast<float>(x);
    } else if constexpr (is_any_scaled_array_v<plain>) {
        return plain(x.template as<float>());
    } else {
        return plain(std::forward<X>(x));
    }
}

}  // namespace detail

/// f under autocast; its ScaledArray result comes back as float data, so the region's low
/// precision stays inside it.
template <class F>
[[nodiscard]] auto autocast_fn(F f)
{
    return [f = std::move(f)](auto&&... args) {
        const autocast scope(true);
        return detail::to_float_boundary(f(std::forward<decltype(args)>(args)...));
    };
}

/// f with autocast off and its ScaledArray arguments cast to float data: a float32 island.
template <class F>
[[nodiscard]] auto float32_fn(F f)
{
    return [f = std::move(f)](auto&&... args) {
        const autocast scope(false);
        return f(detail::to_float_boundary(std::forward<decltype(args)>(args))...);
    };
}

}  // namespace scalify
