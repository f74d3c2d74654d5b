#pragma once
/// \file lane_reduce.hpp
/// Sums and maxima along one lane (a row of softmax or layer norm) in a fixed order that
/// vectorises. A loop with one running sum is a chain of dependent adds that no compiler may
/// reorder without -ffast-math, so it runs one element at a time and keeps every other operation
/// of its loop (softmax's exp) out of vector lanes too. Here element i goes into running sum
/// i mod 8 and the eight are added as ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)): the
/// order is in the source, so the bits are the same on every CPU, scalar or vectorised.

#include <scalify/numeric/math.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace scalify::detail {

/// The number of running sums of lane_sum.
inline constexpr std::size_t lane_ways = 8;

/// combine over term(i), i < n, in lane_ways running results from `initial`: term i goes into
/// result i mod lane_ways, and the eight are combined as ((r0, r4), (r1, r5)), ((r2, r6), (r3, r7)).
template <class V, class Term, class Combine>
[[nodiscard]] inline V lane_reduce(std::size_t n, Term term, V initial, Combine combine)
{
    V part[lane_ways];
    for (V& p : part) p = initial;
    std::size_t i = 0;
    for (; i + lane_ways <= n; i += lane_ways) {
        for (std::size_t l = 0; l < lane_ways; ++l) part[l] = combine(part[l], term(i + l));
    }
    for (std::size_t l = 0; i < n; ++i, ++l) part[l] = combine(part[l], term(i));
    return combine(combine(combine(part[0], part[4]), combine(part[1], part[5])),
                   combine(combine(part[2], part[6]), combine(part[3], part[7])));
}

/// sum of term(i) over i < n, accumulated in V, in lane_ways running sums.
template <class V, class Term>
[[nodiscard]] inline V lane_sum(std::size_t n, Term term)
{
    return lane_reduce<V>(n, term, V(0), [](V x, V y) { return x + y; });
}

/// max of term(i) over i < n as numpy.max has it (NaN if any term is NaN; `lowest` for n = 0),
/// +0 above -0. The max of any order is the same value, so it is taken on integer keys ordered
/// as the floats are: an integer max reduction vectorises where a float select on comparisons
/// stays scalar (GCC keeps float maxima in order without -ffast-math: softmax's max pass took
/// three quarters of its time, one element at a time).
template <class V, class Term>
[[nodiscard]] inline V lane_max(std::size_t n, Term term, V lowest)
{
    using bits = std::conditional_t<sizeof(V) == 4, std::uint32_t, std::uint64_t>;
    using key = std::make_signed_t<bits>;
    constexpr int sign_shift = 8 * sizeof(V) - 1;
    constexpr bits magnitude = ~bits{0} >> 1;
    constexpr bits infinity = std::bit_cast<bits>(std::numeric_limits<V>::infinity());
    // Negative floats' magnitudes turned around below the positive ones: key order is float order.
    const auto key_of = [](bits b) { return static_cast<key>(b ^ (static_cast<bits>(static_cast<key>(b) >> sign_shift) >> 1)); };
    key best = key_of(std::bit_cast<bits>(lowest));
    bits not_a_number = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const bits b = std::bit_cast<bits>(static_cast<V>(term(i)));
        const key k = key_of(b);
        best = k > best ? k : best;
        not_a_number |= static_cast<bits>((b & magnitude) > infinity);
    }
    if (not_a_number != 0) return std::numeric_limits<V>::quiet_NaN();
    return std::bit_cast<V>(static_cast<bits>(key_of(static_cast<bits>(best))));
}

}  // namespace scalify::detail
