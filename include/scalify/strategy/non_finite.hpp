#pragma once
/// \file non_finite.hpp
/// One rule for non-finite data in every scale decision taken from the data (quantize,
/// current_scaling, delayed_scaling, dynamic_rescale_*, dynamic_abs, the matmul recipe's current
/// casts): the statistic (amax, mean |x|, RMS) is that of the finite elements, so a NaN or inf
/// costs no other element its precision; NaN stays NaN in the data and inf follows the store's
/// saturation policy. docs/errors.md has the table, op by op.
///
/// The checked mode, for a divergence: inside a check_finite_scope (per thread, nestable), the
/// first op whose output, or scale decision whose input, holds a NaN or inf throws
/// non_finite_error naming the op and the tensor's statistics.
///
///     { check_finite_scope checked; train_step(params, batch); }   // throws at the first NaN / inf

#include <scalify/detail/lane_reduce.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/math.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <limits>

namespace scalify {

namespace detail {

[[nodiscard]] inline int& check_finite_depth() noexcept
{
    thread_local int depth = 0;
    return depth;
}

}  // namespace detail

/// Whether this thread runs inside a check_finite_scope.
[[nodiscard]] inline bool checking_finite() noexcept { return detail::check_finite_depth() > 0; }

/// Turns the checked mode on for this thread for the scope's lifetime.
class check_finite_scope {
public:
    check_finite_scope() noexcept { ++detail::check_finite_depth(); }
    ~check_finite_scope() { --detail::check_finite_depth(); }
    check_finite_scope(const check_finite_scope&) = delete;
    check_finite_scope& operator=(const check_finite_scope&) = delete;
};

/// Statistics of a tensor's finite elements and its count of non-finite ones, in data units.
struct finite_summary {
    std::size_t count = 0;  ///< elements
    std::size_t nan = 0;
    std::size_t inf = 0;
    double amax = 0.0;         ///< max |x| over the finite elements
    double sum_abs = 0.0;      ///< over the finite elements
    double sum_squares = 0.0;  ///< over the finite elements

    [[nodiscard]] std::size_t non_finite() const noexcept { return nan + inf; }
    [[nodiscard]] std::size_t finite() const noexcept { return count - non_finite(); }
    [[nodiscard]] double mean_abs() const noexcept { return finite() ? sum_abs / double(finite()) : 0.0; }
    [[nodiscard]] double rms() const noexcept { return finite() ? std::sqrt(sum_squares / double(finite())) : 0.0; }
};

namespace detail {

/// One pass over n elements of T (decoded exactly to float or double). The sums run in double in
/// lane_reduce's eight running sums and order (a non-finite element adds 0), branch-free, so the
/// pass vectorises (one running sum made it a chain of dependent adds: 3.8 ns an element).
template <class T>
[[nodiscard]] finite_summary summarize_finite(const T* data, std::size_t n)
{
    double amax[lane_ways] = {}, sum_abs[lane_ways] = {}, sum_squares[lane_ways] = {};
    std::size_t nan = 0, inf = 0;
    const auto take = [&](std::size_t lane, std::size_t i) {
        const double v = static_cast<double>(load(data[i]));
        const bool is_nan = v != v, is_inf = std::abs(v) == std::numeric_limits<double>::infinity();
        nan += is_nan;
        inf += is_inf;
        const double m = bit_select(is_nan || is_inf, 0.0, std::abs(v));
        amax[lane] = m > amax[lane] ? m : amax[lane];
        sum_abs[lane] += m;
        sum_squares[lane] += m * m;
    };
    std::size_t i = 0;
    for (; i + lane_ways <= n; i += lane_ways) {
        for (std::size_t l = 0; l < lane_ways; ++l) take(l, i + l);
    }
    for (std::size_t l = 0; i < n; ++i, ++l) take(l, i);
    static_assert(lane_ways == 8, "the combination below is lane_reduce's for eight running sums");
    const auto sum = [](const double* p) { return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7])); };
    finite_summary s;
    s.count = n;
    s.nan = nan;
    s.inf = inf;
    for (const double m : amax) s.amax = m > s.amax ? m : s.amax;
    s.sum_abs = sum(sum_abs);
    s.sum_squares = sum(sum_squares);
    return s;
}

[[noreturn]] inline void throw_non_finite(const char* op, const char* what, const finite_summary& s, double scale)
{
    SCALIFY_THROW(non_finite_error(fmt::format(
        "{}: {} holds {} NaN and {} inf among {} elements (scale {}; finite elements' amax {:.4g}, RMS {:.4g}, "
        "in data units)",
        op, what, s.nan, s.inf, s.count, scale, s.amax, s.rms())));
}

/// In the checked mode, non_finite_error if `s` counts a NaN or inf.
inline void check_summary(const char* op, const char* what, const finite_summary& s, double scale)
{
    if (checking_finite() && s.non_finite() != 0) throw_non_finite(op, what, s, scale);
}

/// In the checked mode, non_finite_error if the op's result holds a NaN or inf (a result of
/// scale 0 is zeros whatever its data hold). Outside it, one load of a thread_local.
template <class T, class P>
void check_output(const char* op, const ScaledArray<T, P>& result)
{
    if (!checking_finite() || result.scale() == 0.0f) [[likely]] return;
    check_summary(op, "its result", summarize_finite(result.data().data(), result.size()), result.scale());
}

/// The summary of a scale decision's input, checked in the checked mode.
template <class T>
[[nodiscard]] finite_summary summarize_for_scale(const char* op, const T* data, std::size_t n, double scale = 1.0)
{
    finite_summary s = summarize_finite(data, n);
    check_summary(op, "the input of its scale decision", s, scale);
    return s;
}

/// amax after seeing x: |x| where it is larger and finite (NaN never wins, inf is skipped). A
/// select, not a branch: the loops that call it vectorise.
template <class C>
[[nodiscard]] C finite_max(C amax, C x) noexcept
{
    const C m = std::abs(x);
    return m > amax && m <= std::numeric_limits<C>::max() ? m : amax;
}

/// Largest finite |x| computed in C (finite_max): one branch-free pass, for the decisions that
/// need the amax alone. In the checked mode a NaN or inf throws, naming `op`.
template <class C, class T>
[[nodiscard]] C finite_amax_in(const char* op, const T* data, std::size_t n, double scale = 1.0)
{
    if (checking_finite()) (void)summarize_for_scale(op, data, n, scale);
    C amax = C(0);
    for (std::size_t i = 0; i < n; ++i) amax = finite_max(amax, static_cast<C>(load(data[i])));
    return amax;
}

}  // namespace detail

}  // namespace scalify
