#pragma once
/// \file scoped_setting.hpp
/// The body of every scope class that sets one of a thread's settings for its lifetime
/// (autocast, matmul_precision_scope, accumulation_scope, reduction_scope, runtime_scaling::scope).

#include <utility>

namespace scalify::detail {

/// Sets `setting` (a thread's setting, reached by reference) to `value` for the object's lifetime
/// and restores the previous value on destruction, so that scopes nest.
template <class T>
class scoped_setting {
public:
    scoped_setting(T& setting, T value) noexcept : m_setting(setting), m_previous(std::exchange(setting, std::move(value))) {}
    ~scoped_setting() { m_setting = std::move(m_previous); }
    scoped_setting(const scoped_setting&) = delete;
    scoped_setting& operator=(const scoped_setting&) = delete;

private:
    T& m_setting;
    T m_previous;
};

}  // namespace scalify::detail
