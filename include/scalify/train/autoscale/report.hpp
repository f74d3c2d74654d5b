#pragma once
/// \file train/autoscale/report.hpp
/// AutoScale's vocabulary and its report: norms, op phases, history events, the context's
/// configuration, over/underflow warnings, each op's record and the whole report (printable with
/// fmt, written as CSV). The context (context.hpp) fills them in.

#include <scalify/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace scalify::autoscale {

// ---------------------------------------------------------------------------------------------
// Vocabulary

/// The statistic a propagation scale is measured with (the norm the data are scaled to 1 in).
enum class norm_kind {
    rms,     ///< sqrt(mean(x^2))
    stddev,  ///< standard deviation (the design's example)
    amax     ///< max |x|
};

/// Where an op is in its life.
enum class op_phase { analysing, on, frozen };

/// What produced an entry of an op's scale history.
enum class event {
    analysis,     ///< a float32 analysis measurement
    remeasure,    ///< a scheduled re-measurement
    final_check   ///< the re-measurement requested by final_check()
};

[[nodiscard]] constexpr std::string_view to_string(norm_kind n) noexcept
{
    switch (n) {
    case norm_kind::rms: return "rms";
    case norm_kind::stddev: return "stddev";
    case norm_kind::amax: return "amax";
    }
    return "?";
}
[[nodiscard]] constexpr std::string_view to_string(op_phase p) noexcept
{
    switch (p) {
    case op_phase::analysing: return "analysing";
    case op_phase::on: return "on";
    case op_phase::frozen: return "frozen";
    }
    return "?";
}
[[nodiscard]] constexpr std::string_view to_string(event e) noexcept
{
    switch (e) {
    case event::analysis: return "analysis";
    case event::remeasure: return "remeasure";
    case event::final_check: return "final_check";
    }
    return "?";
}

struct context_config {
    std::size_t analysis_iters = 10;  ///< float32 uses per op before the strategy decides, > 0
    norm_kind norm = norm_kind::rms;
    double warn_log2 = 4.0;           ///< warn when a re-measurement moves the multiplier this many binades, > 0
};

/// One entry of an op's scale history: the multiplier measured at a use.
struct history_entry {
    std::size_t use = 0;  ///< 1-based use of the op
    event kind = event::analysis;
    float scale = 0.0f;   ///< the propagation scale measured
    bool warned = false;
};

/// An over/underflow warning.
struct warning {
    std::string op;
    std::size_t use = 0;       ///< 1-based use of the op
    float held = 0.0f;         ///< the multiplier the op ran with
    float measured = 0.0f;     ///< what the data say now
    bool frozen = false;       ///< the op was frozen
    bool final_check = false;  ///< raised by final_check()
    bool saturated = false;    ///< the low-precision result held saturated or non-finite values
    /// log2(measured / held): > 0 the data outgrew the held scale (overflow risk), < 0 underflow risk.
    [[nodiscard]] double log2_change() const noexcept
    {
        return held > 0.0f && measured > 0.0f ? std::log2(double(measured) / double(held)) : 0.0;
    }
};

}  // namespace scalify::autoscale

template <>
struct fmt::formatter<scalify::autoscale::warning> {
    constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
    // The return type named: fmt instantiates a deduced one's body wherever the header is read.
    template <class Context>
    typename Context::iterator format(const scalify::autoscale::warning& w, Context& ctx) const
    {
        const double change = w.log2_change();
        // fmt::format, not format_to: format_to compiles fmt's formatting engine into every program
        // that prints this (fmt 9 declares it for no type extern), format runs libfmt's.
        const std::string text =
            fmt::format("op '{}' use {}: propagation scale {:.4g} -> {:.4g} ({:+.1f} binades, {} risk{}){}{}", w.op, w.use,
                        w.held, w.measured, change, change >= 0 ? "overflow" : "underflow",
                        w.saturated ? ", saturated values seen" : "", w.frozen ? " [frozen op]" : "",
                        w.final_check ? " [final check]" : "");
        return std::copy(text.begin(), text.end(), ctx.out());
    }
};

namespace scalify::autoscale {

/// The state of one op, as the report shows it.
struct op_record {
    std::string name;
    op_phase phase = op_phase::analysing;
    std::size_t period = 1;                 ///< after analysis: re-measured every `period` uses; 0 frozen
    std::size_t uses = 0;
    std::size_t analysis_measurements = 0;  ///< valid float32 measurements during analysis
    std::size_t remeasurements = 0;         ///< after analysis, the final check included
    std::size_t fallbacks = 0;              ///< re-measurements that needed a float32 run
    std::size_t warnings = 0;
    float prop_scale = 1.0f;                ///< the multiplier held now
    std::vector<history_entry> history;     ///< every measurement, in order
    bool final_check_pending = false;

    // analysis statistics of log2(prop_scale)
    double mean_log2 = 0.0;
    double m2_log2 = 0.0;
    double min_log2 = 0.0;
    double max_log2 = 0.0;
    double max_step_log2 = 0.0;
    double last_log2 = 0.0;
};

// ---------------------------------------------------------------------------------------------
// Report

/// Everything the context knows: strategy, configuration, each op's record, every warning.
struct scaling_report {
    std::string strategy;
    context_config config;
    std::vector<op_record> ops;
    std::vector<warning> warnings;

    /// Re-measurements after analysis over all ops (what a strategy saves on).
    [[nodiscard]] std::size_t remeasurements() const noexcept
    {
        std::size_t n = 0;
        for (const auto& op : ops) n += op.remeasurements;
        return n;
    }
    [[nodiscard]] std::size_t count(op_phase phase) const noexcept
    {
        return static_cast<std::size_t>(std::count_if(ops.begin(), ops.end(), [&](const op_record& op) { return op.phase == phase; }));
    }
    [[nodiscard]] const op_record& op(std::string_view name) const
    {
        for (const auto& op : ops) {
            if (op.name == name) return op;
        }
        SCALIFY_THROW(config_error(fmt::format("autoscale report: no op named '{}'", name)));
        return ops.front();  // only reached if SCALIFY_THROW returns
    }

    /// One row per op: op,state,period,uses,analysis_measurements,remeasurements,fallbacks,warnings,prop_scale.
    void write_csv(std::ostream& out) const
    {
        out << "op,state,period,uses,analysis_measurements,remeasurements,fallbacks,warnings,prop_scale\n";
        for (const auto& op : ops) {
            out << fmt::format("{},{},{},{},{},{},{},{},{}\n", op.name, to_string(op.phase), op.period, op.uses,
                               op.analysis_measurements, op.remeasurements, op.fallbacks, op.warnings, op.prop_scale);
        }
    }
    /// One row per measurement: op,state,use,event,prop_scale,warned (floats in shortest round-trip form).
    void write_history_csv(std::ostream& out) const
    {
        out << "op,state,use,event,prop_scale,warned\n";
        for (const auto& op : ops) {
            for (const auto& h : op.history) {
                out << fmt::format("{},{},{},{},{},{}\n", op.name, to_string(op.phase), h.use, to_string(h.kind), h.scale,
                                   h.warned ? 1 : 0);
            }
        }
    }
};

}  // namespace scalify::autoscale

template <>
struct fmt::formatter<scalify::autoscale::scaling_report> {
    constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
    // The return type named: fmt instantiates a deduced one's body wherever the header is read.
    template <class Context>
    typename Context::iterator format(const scalify::autoscale::scaling_report& r, Context& ctx) const
    {
        using scalify::autoscale::op_phase;
        std::size_t width = 2;
        for (const auto& op : r.ops) width = std::max(width, op.name.size());
        std::string text = fmt::format(  // not format_to: see formatter<warning>
            "autoscale report: {}; analysis {} uses, norm {}, warn at {} binades\n"
            "{} ops ({} on, {} frozen, {} analysing), {} re-measurements, {} warnings\n",
            r.strategy, r.config.analysis_iters, to_string(r.config.norm), r.config.warn_log2, r.ops.size(),
            r.count(op_phase::on), r.count(op_phase::frozen), r.count(op_phase::analysing), r.remeasurements(),
            r.warnings.size());
        text += fmt::format("{:<{}}  {:<9}  {:>6}  {:>7}  {:>8}  {:>9}  {:>9}  {:>8}  {:>11}  {}\n", "op", width,
                            "state", "period", "uses", "analysed", "measured", "fallbacks", "warnings", "prop_scale",
                            "history min..max");
        for (const auto& op : r.ops) {
            float lo = op.prop_scale, hi = op.prop_scale;
            for (const auto& h : op.history) {
                lo = std::min(lo, h.scale);
                hi = std::max(hi, h.scale);
            }
            text += fmt::format("{:<{}}  {:<9}  {:>6}  {:>7}  {:>8}  {:>9}  {:>9}  {:>8}  {:>11.4g}  {:.4g}..{:.4g}\n",
                                op.name, width, to_string(op.phase), op.period, op.uses, op.analysis_measurements,
                                op.remeasurements, op.fallbacks, op.warnings, op.prop_scale, lo, hi);
        }
        for (const auto& w : r.warnings) text += fmt::format("warning: {}\n", w);
        return std::copy(text.begin(), text.end(), ctx.out());
    }
};
