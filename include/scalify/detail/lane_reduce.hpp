#pragma once
/// \file lane_reduce.hpp
/// Sums and maxima along one lane (a row of softmax or layer norm) in a fixed order that
/// vectorises. A loop with one running sum is a chain of dependent adds that no compiler may
/// reorder without -ffast-math, so it runs one element at a time and keeps every other operation
/// of its loop (softmax's exp) out of vector lanes too. Here element i goes into running sum
/// i mod 8 and the eight are added as ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)): the
/// order is in the source, so the bits are the same on every CPU, scalar or vectorised.

#include <cstddef>

namespace scalify::detail {

/// The number of running sums (or maxima) of lane_sum and lane_max.
inline constexpr std::size_t lane_ways = 8;

/// sum of term(i) over i < n, accumulated in V, in lane_ways running sums.
template <class V, class Term>
[[nodiscard]] inline V lane_sum(std::size_t n, Term term)
{
    V part[lane_ways] = {};
    std::size_t i = 0;
    for (; i + lane_ways <= n; i += lane_ways) {
        for (std::size_t l = 0; l < lane_ways; ++l) part[l] += term(i + l);
    }
    for (std::size_t l = 0; i < n; ++i, ++l) part[l] += term(i);
    return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

/// max of term(i) over i < n as numpy.max has it (NaN if any term is NaN; -inf for n = 0),
/// in lane_ways running maxima. The max of any order is the same value.
template <class V, class Term>
[[nodiscard]] inline V lane_max(std::size_t n, Term term, V lowest)
{
    const auto nan_max = [](V x, V y) { return (x != x || x > y) ? x : y; };
    V part[lane_ways];
    for (V& p : part) p = lowest;
    std::size_t i = 0;
    for (; i + lane_ways <= n; i += lane_ways) {
        for (std::size_t l = 0; l < lane_ways; ++l) part[l] = nan_max(part[l], term(i + l));
    }
    for (std::size_t l = 0; i < n; ++i, ++l) part[l] = nan_max(part[l], term(i));
    return nan_max(nan_max(nan_max(part[0], part[4]), nan_max(part[1], part[5])),
                   nan_max(nan_max(part[2], part[6]), nan_max(part[3], part[7])));
}

}  // namespace scalify::detail
