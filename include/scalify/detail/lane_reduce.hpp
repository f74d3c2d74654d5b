#pragma once
/// \file lane_reduce.hpp
/// Sums and maxima along one lane (a row of softmax or layer norm) in a fixed order that
/// vectorises. A loop with one running sum is a chain of dependent adds that no compiler may
/// reorder without -ffast-math, so it runs one element at a time and keeps every other operation
/// of its loop (softmax's exp) out of vector lanes too. Here element i goes into running sum
/// i mod 8 and the eight are added as ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)): the
/// order is in the source, so the bits are the same on every CPU, scalar or vectorised.

#include <scalify/numeric/math.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace scalify::detail {

/// The number of running sums of lane_sum.
inline constexpr std::size_t lane_ways = 8;

/// Lanes per pass of the reductions across lanes (lane_reduce_across, lane_max_across): their
/// running results stay in L1. Callers that hand them blocks of at most this many lanes can keep
/// the results in arrays of it.
inline constexpr std::size_t lanes_across = 64;

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

/// lane_reduce of `width` lanes side by side: term(k, l) is lane l's k-th term, and out[l]
/// receives what lane_reduce gives lane l alone (its term k into running result k mod
/// lane_ways, combined the same way), while the loops run across the lanes: lanes along an
/// axis other than the last, read one at a time, would touch a cache line per element.
template <class V, class Term, class Combine>
void lane_reduce_across(std::size_t n, std::size_t width, Term term, V initial, Combine combine, V* out)
{
    constexpr std::size_t block = lanes_across;
    for (std::size_t l0 = 0; l0 < width; l0 += block) {
        const std::size_t w = std::min(block, width - l0);
        V part[lane_ways][block];
        for (V* p : part) std::fill_n(p, w, initial);
        for (std::size_t k = 0; k < n; ++k) {
            V* p = part[k % lane_ways];
            for (std::size_t l = 0; l < w; ++l) p[l] = combine(p[l], term(k, l0 + l));
        }
        for (std::size_t l = 0; l < w; ++l) {
            out[l0 + l] = combine(combine(combine(part[0][l], part[4][l]), combine(part[1][l], part[5][l])),
                                  combine(combine(part[2][l], part[6][l]), combine(part[3][l], part[7][l])));
        }
    }
}

/// sum of term(i) over i < n, accumulated in V, in lane_ways running sums.
template <class V, class Term>
[[nodiscard]] inline V lane_sum(std::size_t n, Term term)
{
    return lane_reduce<V>(n, term, V(0), [](V x, V y) { return x + y; });
}

/// lane_sum of `width` lanes side by side (lane_reduce_across): out[l] = lane l's lane_sum.
template <class V, class Term>
void lane_sum_across(std::size_t n, std::size_t width, Term term, V* out)
{
    lane_reduce_across<V>(n, width, term, V(0), [](V x, V y) { return x + y; }, out);
}

/// Floats as signed integers in the floats' order (negative magnitudes turned around below the
/// positive ones), for lane_max.
template <class V>
struct float_order {
    using bits = std::conditional_t<sizeof(V) == 4, std::uint32_t, std::uint64_t>;
    using key = std::make_signed_t<bits>;
    static constexpr int sign_shift = 8 * sizeof(V) - 1;
    static constexpr bits magnitude = ~bits{0} >> 1;
    static constexpr bits infinity = std::bit_cast<bits>(std::numeric_limits<V>::infinity());
    [[nodiscard]] static key key_of(bits b) noexcept
    {
        return static_cast<key>(b ^ (static_cast<bits>(static_cast<key>(b) >> sign_shift) >> 1));
    }
    /// key_of is its own inverse.
    [[nodiscard]] static V value_of(key k) noexcept { return std::bit_cast<V>(static_cast<bits>(key_of(static_cast<bits>(k)))); }
    [[nodiscard]] static bits nan_bit(bits b) noexcept { return static_cast<bits>((b & magnitude) > infinity); }
};

/// max of term(i) over i < n as numpy.max has it (NaN if any term is NaN; `lowest` for n = 0),
/// +0 above -0. The max of any order is the same value, so it is taken on integer keys ordered
/// as the floats are: an integer max reduction vectorises where a float select on comparisons
/// stays scalar (GCC keeps float maxima in order without -ffast-math: softmax's max pass took
/// three quarters of its time, one element at a time).
template <class V, class Term>
[[nodiscard]] inline V lane_max(std::size_t n, Term term, V lowest)
{
    using order = float_order<V>;
    typename order::key best = order::key_of(std::bit_cast<typename order::bits>(lowest));
    typename order::bits not_a_number = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const auto b = std::bit_cast<typename order::bits>(static_cast<V>(term(i)));
        const auto k = order::key_of(b);
        best = k > best ? k : best;
        not_a_number |= order::nan_bit(b);
    }
    if (not_a_number != 0) return std::numeric_limits<V>::quiet_NaN();
    return order::value_of(best);
}

/// lane_max of `width` lanes side by side: term(k, l) is lane l's k-th term; out[l] = lane l's
/// lane_max (a max of any order is the same value).
template <class V, class Term>
void lane_max_across(std::size_t n, std::size_t width, Term term, V lowest, V* out)
{
    using order = float_order<V>;
    constexpr std::size_t block = lanes_across;
    for (std::size_t l0 = 0; l0 < width; l0 += block) {
        const std::size_t w = std::min(block, width - l0);
        typename order::key best[block];
        typename order::bits not_a_number[block];
        std::fill_n(best, w, order::key_of(std::bit_cast<typename order::bits>(lowest)));
        std::fill_n(not_a_number, w, typename order::bits{0});
        for (std::size_t k = 0; k < n; ++k) {
            for (std::size_t l = 0; l < w; ++l) {
                const auto b = std::bit_cast<typename order::bits>(static_cast<V>(term(k, l0 + l)));
                const auto key = order::key_of(b);
                best[l] = key > best[l] ? key : best[l];
                not_a_number[l] |= order::nan_bit(b);
            }
        }
        for (std::size_t l = 0; l < w; ++l)
            out[l0 + l] = not_a_number[l] != 0 ? std::numeric_limits<V>::quiet_NaN() : order::value_of(best[l]);
    }
}

}  // namespace scalify::detail
