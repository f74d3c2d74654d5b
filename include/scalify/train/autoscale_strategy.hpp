#pragma once
/// \file autoscale_strategy.hpp
/// AutoScale rescale strategies: after its analysis uses, each op is given a re-measurement period
/// (re-measured every `period` uses, or frozen: period 0) from what the analysis saw.
///
/// - conservative: every op on, re-measured at every use (the design's default, "on everywhere");
/// - on_off(op_freq, loop_freq): the share op_freq of ops whose propagation scale moved most
///   during analysis stays on, re-measured every round(1 / loop_freq) uses; the rest are frozen;
/// - adaptive: every op on, each at its own period, from how fast its scale moved during analysis.
///
/// A strategy is any type with `schedule(std::span<const op_summary>) -> std::vector<std::size_t>`
/// (one period per op, in order) and `describe() -> std::string`: the RescaleStrategy concept.
///
///     autoscale::scaling_context<> ctx({.analysis_iters = 6}, autoscale::on_off(1.0 / 3, 1.0 / 20));

#include <scalify/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace scalify::autoscale {

/// What a strategy sees of one op once its analysis is over. All statistics are of log2 of the
/// op's measured propagation scale over its analysis uses (zero and non-finite measurements skipped).
struct op_summary {
    std::string_view name;
    std::size_t measurements = 0;  ///< valid analysis measurements
    double mean_log2 = 0.0;
    double stddev_log2 = 0.0;
    /// max - min; +inf with fewer than two measurements (nothing is known about its stability)
    double range_log2 = std::numeric_limits<double>::infinity();
    /// largest change between consecutive measurements; +inf with fewer than two
    double max_step_log2 = std::numeric_limits<double>::infinity();
};

/// A rescale strategy: one period per op (0 = frozen, n = re-measured every n uses).
template <class S>
concept RescaleStrategy = requires(const S& s, std::span<const op_summary> ops) {
    { s.schedule(ops) } -> std::same_as<std::vector<std::size_t>>;
    { s.describe() } -> std::convertible_to<std::string>;
};

/// Every op on, re-measured at every use: full accuracy at the cost of a statistic per op per use.
struct conservative {
    [[nodiscard]] std::vector<std::size_t> schedule(std::span<const op_summary> ops) const
    {
        return std::vector<std::size_t>(ops.size(), 1);
    }
    [[nodiscard]] std::string describe() const { return "conservative (every op re-measured at every use)"; }
};

/// The design's on/off strategy: the share op_freq of ops stays on and is re-measured every
/// round(1 / loop_freq) uses, the rest are frozen. The ops kept on are those whose propagation scale
/// moved most during analysis (range of log2; ties keep registration order), and at least one op stays
/// on whenever op_freq > 0. on_off(1, 1) is conservative.
///
///     on_off(1.0 / 3, 1.0 / 20)   // a third of the ops re-measured every 20 uses, the rest frozen
class on_off {
public:
    /// config_error unless op_freq is in [0, 1] and loop_freq in (0, 1].
    on_off(double op_freq, double loop_freq) : m_op_freq(op_freq), m_loop_freq(loop_freq)
    {
        if (!(op_freq >= 0.0 && op_freq <= 1.0)) {
            SCALIFY_THROW(config_error(fmt::format("autoscale::on_off: op_freq must be in [0, 1], got {}", op_freq)));
        }
        if (!(loop_freq > 0.0 && loop_freq <= 1.0)) {
            SCALIFY_THROW(config_error(fmt::format("autoscale::on_off: loop_freq must be in (0, 1], got {}", loop_freq)));
        }
    }

    [[nodiscard]] double op_freq() const noexcept { return m_op_freq; }
    [[nodiscard]] double loop_freq() const noexcept { return m_loop_freq; }
    /// round(1 / loop_freq), at least 1.
    [[nodiscard]] std::size_t period() const noexcept
    {
        if (!(m_loop_freq > 0.0)) return 1;  // only reachable if SCALIFY_THROW returned
        return std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(1.0 / m_loop_freq)));
    }
    /// ceil(op_freq * n), computed so that 1/3 of 3 ops is 1.
    [[nodiscard]] std::size_t ops_on(std::size_t n) const noexcept
    {
        const double wanted = m_op_freq * static_cast<double>(n);
        return std::min(n, static_cast<std::size_t>(std::ceil(wanted - 1e-9)));
    }

    [[nodiscard]] std::vector<std::size_t> schedule(std::span<const op_summary> ops) const
    {
        std::vector<std::size_t> order(ops.size());
        std::iota(order.begin(), order.end(), std::size_t{0});
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t a, std::size_t b) { return ops[a].range_log2 > ops[b].range_log2; });
        std::vector<std::size_t> periods(ops.size(), 0);
        const std::size_t on = ops_on(ops.size());
        for (std::size_t i = 0; i < on; ++i) periods[order[i]] = period();
        return periods;
    }
    [[nodiscard]] std::string describe() const
    {
        return fmt::format("on_off(op_freq={:.4g}, loop_freq={:.4g}): {:.4g}% of ops re-measured every {} uses, the rest frozen",
                           m_op_freq, m_loop_freq, 100 * m_op_freq, period());
    }

private:
    double m_op_freq;
    double m_loop_freq;
};

/// Per-op frequencies from the analysis statistics: an op whose log2 propagation scale moved by up to
/// r binades between consecutive analysis uses is re-measured every clamp(floor(tolerance_log2 / r),
/// min_period, max_period) uses (an op that did not move: max_period; one with fewer than two
/// measurements: min_period). No op is frozen.
class adaptive {
public:
    /// config_error unless tolerance_log2 > 0 and 1 <= min_period <= max_period.
    explicit adaptive(double tolerance_log2 = 0.5, std::size_t min_period = 1, std::size_t max_period = 1000)
        : m_tolerance(tolerance_log2), m_min(min_period), m_max(max_period)
    {
        if (!(tolerance_log2 > 0.0) || !std::isfinite(tolerance_log2)) {
            SCALIFY_THROW(config_error(
                fmt::format("autoscale::adaptive: tolerance_log2 must be finite and > 0, got {}", tolerance_log2)));
        }
        if (min_period == 0 || min_period > max_period) {
            SCALIFY_THROW(config_error(fmt::format(
                "autoscale::adaptive: need 1 <= min_period <= max_period, got min_period {} and max_period {}", min_period,
                max_period)));
        }
    }

    [[nodiscard]] std::size_t period_for(const op_summary& op) const noexcept
    {
        if (!std::isfinite(op.max_step_log2)) return m_min;
        if (!(op.max_step_log2 > 0.0)) return m_max;
        const double periods = std::floor(m_tolerance / op.max_step_log2);
        if (periods >= static_cast<double>(m_max)) return m_max;
        return std::max(m_min, static_cast<std::size_t>(periods));
    }
    [[nodiscard]] std::vector<std::size_t> schedule(std::span<const op_summary> ops) const
    {
        std::vector<std::size_t> periods;
        periods.reserve(ops.size());
        for (const auto& op : ops) periods.push_back(period_for(op));
        return periods;
    }
    [[nodiscard]] std::string describe() const
    {
        return fmt::format("adaptive(tolerance_log2={:.4g}, periods {}..{})", m_tolerance, m_min, m_max);
    }

private:
    double m_tolerance;
    std::size_t m_min;
    std::size_t m_max;
};

static_assert(RescaleStrategy<conservative> && RescaleStrategy<on_off> && RescaleStrategy<adaptive>);

}  // namespace scalify::autoscale
