#pragma once
/// \file format.hpp
/// Printing: fmt::formatter and operator<< for minifloat. The formatter inherits fmt's float
/// formatter, so every float format spec works: fmt::format("{:.3e}", x).

#include <scalify/numeric/minifloat.hpp>

#include <fmt/format.h>

#include <ostream>

template <scalify::FloatFormat F, class Char>
struct fmt::formatter<scalify::minifloat<F>, Char> : fmt::formatter<float, Char> {
    template <class FormatContext>
    auto format(scalify::minifloat<F> x, FormatContext& context) const
    {
        return fmt::formatter<float, Char>::format(static_cast<float>(x), context);
    }
};

namespace scalify {

/// Prints the value as float does (shortest round-trip digits).
template <FloatFormat F>
std::ostream& operator<<(std::ostream& os, minifloat<F> x)
{
    return os << static_cast<float>(x);
}

}  // namespace scalify
