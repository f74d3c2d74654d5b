#pragma once
/// \file autoscale.hpp
/// AutoScale (design: "Scale propagation proposal B"). Every scaled op holds a *propagation scale*,
/// a multiplier on its natural scale (the product of its input scales for a matmul, the input scale
/// for a cast, ...): the result is stored with
///
///     y.scale = natural * prop_scale          y.data = raw / prop_scale
///
/// (for a matmul `y.scale = x.scale * w.scale * prop_scale`, `y.data = x.data @ w.data / prop_scale`),
/// so a scale change anywhere upstream flows through an op whose own multiplier stays put.
///
/// 1. Analysis: an op's first `analysis_iters` uses run in float32; each measures the propagation
///    scale as norm(raw) (RMS, standard deviation or amax of x.data @ w.data, say) and collects its
///    statistics. While analysing, the runtime-typed API returns float32 data.
/// 2. When an op that finished its analysis is used again, the rescale strategy (autoscale_strategy.hpp)
///    gives every op that finished its analysis a period: re-measured every `period` uses, or frozen
///    (period 0, held at the geometric mean of its analysis measurements).
/// 3. After analysis the op runs in its low-precision type with the held multiplier, saturating.
///    A re-measurement costs a statistic of that low-precision result: prop *= norm(y.data)
///    (the data should have norm 1). Only when the statistic cannot be trusted (|log2 norm| beyond
///    warn_log2, saturated or non-finite values, all zeros) does the op run once more in float32 to
///    measure exactly, and that use's result is re-stored under the corrected scale.
/// 4. A re-measurement that moves the multiplier by more than warn_log2 binades, or that finds saturated
///    or non-finite values, raises an over/underflow warning (handler; default: one line on stderr).
/// 5. final_check(): the next use of every op, frozen ones included, re-measures and compares. It
///    only looks: the ops keep their multipliers and results (unless a result saturated), so no
///    correction upstream moves the data an op downstream is checked on.
/// 6. report(): per op its state (analysing / on / frozen), period, re-measurement count and scale
///    history; printable with fmt and written as CSV.
///
///     autoscale::scaling_context<float_scale> ctx({.analysis_iters = 6, .norm = autoscale::norm_kind::stddev},
///                                                 autoscale::on_off(1.0 / 3, 1.0 / 20));
///     autoscale::linear<float8_e4m3fn, float_scale> fc(ctx, "fc", w);     // holds its prop_scale
///     auto x8 = ctx.scale("x", x, dtype::float8_e4m3fn);                 // float32 while analysing
///     auto y = fc(x8);                                                     // y.scale = x.scale * w.scale * prop
///     xt::xarray<float> z = ctx.unscale(y).value();
///
/// Any primitive runs under the context through apply(), which hands the primitive the strategy to use:
///
///     auto h = ctx.apply<float8_e4m3fn>(ctx.op("act"), [&]<class S>(autoscale::strategy_tag<S>) {
///         return gelu<S, float>(y8);
///     });
///
/// Inside autodiff graphs (forward and backward ops each with a multiplier): autoscale_ad.hpp.

#include <scalify/amp/any_scaled_array.hpp>
#include <scalify/dist/reducer.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/matmul.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/scaling.hpp>
#include <scalify/train/autoscale_strategy.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
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
    template <class Context>
    auto format(const scalify::autoscale::warning& w, Context& ctx) const
    {
        const double change = w.log2_change();
        return fmt::format_to(ctx.out(), "op '{}' use {}: propagation scale {:.4g} -> {:.4g} ({:+.1f} binades, {} risk{}){}{}",
                              w.op, w.use, w.held, w.measured, change, change >= 0 ? "overflow" : "underflow",
                              w.saturated ? ", saturated values seen" : "", w.frozen ? " [frozen op]" : "",
                              w.final_check ? " [final check]" : "");
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

// ---------------------------------------------------------------------------------------------
// Statistics

namespace detail {

struct data_statistic {
    double norm = 0.0;
    std::size_t count = 0;
    std::size_t non_finite = 0;
    std::size_t saturated = 0;  ///< |x| >= the saturation bound
};

/// norm of the finite elements; saturated counts |x| >= bound. Over every rank of
/// dist::current_reducer().
template <class T>
[[nodiscard]] data_statistic measure(const xt::xarray<T>& data, norm_kind kind, double bound)
{
    data_statistic s;
    double sum = 0.0, sum_sq = 0.0, amax = 0.0;
    std::size_t finite = 0;
    const T* p = data.data();
    const std::size_t n = data.size();
    s.count = n;
    for (std::size_t i = 0; i < n; ++i) {
        const double v = static_cast<double>(scalify::detail::load(p[i]));
        if (!std::isfinite(v)) {
            ++s.non_finite;
            continue;
        }
        ++finite;
        sum += v;
        sum_sq += v * v;
        const double m = std::abs(v);
        amax = m > amax ? m : amax;
        s.saturated += m >= bound ? 1 : 0;
    }
    // Over every rank of dist::current_reducer(): every rank measures the global tensor and keeps
    // the same multiplier (the ranks' scales agree, since every scale decision is reduced).
    double count = static_cast<double>(finite);
    if (dist::reducer& world = dist::current_reducer(); world.size() > 1) {
        double sums[] = {sum, sum_sq, count, static_cast<double>(n), static_cast<double>(s.non_finite),
                         static_cast<double>(s.saturated)};
        world.sum(sums);
        amax = world.max(amax);
        sum = sums[0], sum_sq = sums[1], count = sums[2];
        s.count = static_cast<std::size_t>(sums[3]);
        s.non_finite = static_cast<std::size_t>(sums[4]);
        s.saturated = static_cast<std::size_t>(sums[5]);
    }
    if (count == 0.0) return s;
    switch (kind) {
    case norm_kind::rms: s.norm = std::sqrt(sum_sq / count); break;
    case norm_kind::stddev: {
        const double mean = sum / count;
        s.norm = std::sqrt(std::max(0.0, sum_sq / count - mean * mean));
        break;
    }
    case norm_kind::amax: s.norm = amax; break;
    }
    return s;
}

/// A measured multiplier that float32 can hold as a positive normal-or-subnormal number.
[[nodiscard]] inline bool usable(double m) noexcept
{
    return m > 0.0 && static_cast<float>(m) > 0.0f && std::isfinite(static_cast<float>(m));
}

/// The largest finite value of T, or +inf for float/double (which do not saturate here).
template <ScaledElement T>
[[nodiscard]] double saturation_bound() noexcept
{
    if constexpr (std::same_as<T, float> || std::same_as<T, double>) return std::numeric_limits<double>::infinity();
    else return static_cast<double>(static_cast<float>(std::numeric_limits<T>::max()));
}

/// Float data into Out, rounding to nearest even and saturating (finite overflow clamps to max).
template <ScaledElement Out, ScalePolicy P>
[[nodiscard]] ScaledArray<Out, P> saturating_cast(ScaledArray<float, P>&& a)
{
    if constexpr (std::same_as<Out, float>) return std::move(a);
    else return cast<Out, round_nearest_even, saturate_finite>(a);
}

/// Calls f with a default-constructed T for the runtime dtype.
template <class F>
decltype(auto) with_dtype(dtype type, F&& f)
{
    switch (type) {
    case dtype::float16: return f(Eigen::half{});
    case dtype::bfloat16: return f(Eigen::bfloat16{});
    case dtype::float8_e4m3fn: return f(float8_e4m3fn{});
    case dtype::float8_e5m2: return f(float8_e5m2{});
    case dtype::float32: break;
    }
    return f(float{});
}

}  // namespace detail

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
    template <class Context>
    auto format(const scalify::autoscale::scaling_report& r, Context& ctx) const
    {
        using scalify::autoscale::op_phase;
        std::size_t width = 2;
        for (const auto& op : r.ops) width = std::max(width, op.name.size());
        auto out = fmt::format_to(ctx.out(),
                                  "autoscale report: {}; analysis {} uses, norm {}, warn at {} binades\n"
                                  "{} ops ({} on, {} frozen, {} analysing), {} re-measurements, {} warnings\n",
                                  r.strategy, r.config.analysis_iters, to_string(r.config.norm), r.config.warn_log2,
                                  r.ops.size(), r.count(op_phase::on), r.count(op_phase::frozen),
                                  r.count(op_phase::analysing), r.remeasurements(), r.warnings.size());
        out = fmt::format_to(out, "{:<{}}  {:<9}  {:>6}  {:>7}  {:>8}  {:>9}  {:>9}  {:>8}  {:>11}  {}\n", "op", width,
                             "state", "period", "uses", "analysed", "measured", "fallbacks", "warnings", "prop_scale",
                             "history min..max");
        for (const auto& op : r.ops) {
            float lo = op.prop_scale, hi = op.prop_scale;
            for (const auto& h : op.history) {
                lo = std::min(lo, h.scale);
                hi = std::max(hi, h.scale);
            }
            out = fmt::format_to(out, "{:<{}}  {:<9}  {:>6}  {:>7}  {:>8}  {:>9}  {:>9}  {:>8}  {:>11.4g}  {:.4g}..{:.4g}\n",
                                 op.name, width, to_string(op.phase), op.period, op.uses, op.analysis_measurements,
                                 op.remeasurements, op.fallbacks, op.warnings, op.prop_scale, lo, hi);
        }
        for (const auto& w : r.warnings) out = fmt::format_to(out, "warning: {}\n", w);
        return out;
    }
};

namespace scalify::autoscale {

// ---------------------------------------------------------------------------------------------
// The scaling context

/// Identifies an op of one context (from scaling_context::op).
class op_handle {
public:
    op_handle() = default;
    [[nodiscard]] bool valid() const noexcept { return m_owner != nullptr; }

private:
    template <ScalePolicy>
    friend class scaling_context;
    op_handle(const void* owner, std::size_t index) noexcept : m_owner(owner), m_index(index) {}
    const void* m_owner = nullptr;
    std::size_t m_index = 0;
};

template <ScalePolicy Policy = pow2_scale>
class scaling_context {
public:
    using policy = Policy;
    using warning_handler = std::function<void(const warning&)>;

    /// The conservative strategy: every op on.
    explicit scaling_context(context_config config = {}) : scaling_context(config, conservative{}) {}

    /// config_error unless analysis_iters > 0 and warn_log2 > 0.
    template <RescaleStrategy S>
    scaling_context(context_config config, S strategy)
        : m_config(config), m_strategy_name(strategy.describe()),
          m_schedule([s = std::move(strategy)](std::span<const op_summary> ops) { return s.schedule(ops); })
    {
        if (config.analysis_iters == 0) {
            SCALIFY_THROW(config_error("autoscale::scaling_context: analysis_iters must be > 0, got 0"));
        }
        if (!(config.warn_log2 > 0.0)) {
            SCALIFY_THROW(config_error(
                fmt::format("autoscale::scaling_context: warn_log2 must be > 0, got {}", config.warn_log2)));
        }
        m_handler = [](const warning& w) { std::fputs(fmt::format("scalify autoscale: {}\n", w).c_str(), stderr); };
    }

    // Layers and handles point into the context: it stays where it was made.
    scaling_context(const scaling_context&) = delete;
    scaling_context& operator=(const scaling_context&) = delete;

    /// The op named `name`, registered on first call.
    [[nodiscard]] op_handle op(std::string_view name)
    {
        if (const auto it = m_index.find(name); it != m_index.end()) return op_handle(this, it->second);
        if (name.empty()) SCALIFY_THROW(config_error("autoscale::scaling_context: an op name must not be empty"));
        m_ops.emplace_back();
        m_ops.back().name = std::string(name);
        m_index.emplace(std::string(name), m_ops.size() - 1);
        return op_handle(this, m_ops.size() - 1);
    }
    [[nodiscard]] const op_record& record(op_handle handle) const { return m_ops[checked(handle)]; }
    [[nodiscard]] const op_record& record(std::string_view name) const
    {
        const auto it = m_index.find(name);
        if (it == m_index.end()) SCALIFY_THROW(config_error(fmt::format("autoscale::scaling_context: no op named '{}'", name)));
        return m_ops[it == m_index.end() ? 0 : it->second];
    }
    /// The multiplier op `name` holds now.
    [[nodiscard]] float prop_scale(std::string_view name) const { return record(name).prop_scale; }

    // ---- scale / unscale --------------------------------------------------------------------

    /// x (value data * scale) into `to` with the cast op's propagation scale: scale = x.scale * prop,
    /// prop measured as norm(x.data). float32 data while the op analyses.
    template <ScaledElement T>
    [[nodiscard]] any_scaled_array<Policy> scale(op_handle op, const ScaledArray<T, Policy>& x, dtype to)
    {
        op_record& r = m_ops[checked(op)];
        const bool wide = m_inference ? r.analysis_measurements == 0 : begin_use(r);
        auto compute = cast_compute(x);
        if (wide) return m_inference ? unrecorded_analysis(r, compute) : analyse(r, compute);
        return detail::with_dtype(to, [&](auto tag) -> any_scaled_array<Policy> { return held_cast<decltype(tag)>(r, x); });
    }
    template <ScaledElement T>
    [[nodiscard]] any_scaled_array<Policy> scale(std::string_view name, const ScaledArray<T, Policy>& x, dtype to)
    {
        return scale(op(name), x, to);
    }
    /// A plain float tensor (scale 1): the scale becomes norm(x), as in the design's example.
    [[nodiscard]] any_scaled_array<Policy> scale(std::string_view name, const xt::xarray<float>& x, dtype to)
    {
        return scale(op(name), ScaledArray<float, Policy>(x, 1.0f), to);
    }
    /// Statically typed cast (for graphs whose types are fixed): always Out, also while analysing
    /// (the measurement is still made on the float32 data).
    template <ScaledElement Out, ScaledElement T>
    [[nodiscard]] ScaledArray<Out, Policy> scale_as(op_handle op, const ScaledArray<T, Policy>& x)
    {
        op_record& r = m_ops[checked(op)];
        const bool wide = m_inference ? r.analysis_measurements == 0 : begin_use(r);
        if (wide) {
            auto compute = cast_compute(x);
            return detail::saturating_cast<Out>(m_inference ? unrecorded_analysis(r, compute) : analyse(r, compute));
        }
        return held_cast<Out>(r, x);
    }

    /// y's value (data * scale) as `to` under scale 1; float32 by default. Not an op: nothing to measure.
    [[nodiscard]] any_scaled_array<Policy> unscale(const any_scaled_array<Policy>& y, dtype to = dtype::float32) const
    {
        const xt::xarray<float> value = y.value();
        return detail::with_dtype(to, [&](auto tag) -> any_scaled_array<Policy> {
            using T = decltype(tag);
            return detail::saturating_cast<T>(ScaledArray<float, Policy>(value, 1.0f));
        });
    }

    // ---- any primitive ----------------------------------------------------------------------

    /// One use of op `op`. compute(strategy_tag<S>{}) runs exactly one scalify primitive with scaling
    /// strategy S, best with float output (ScaledArray<float, Policy>); it may be called twice in one use (a
    /// float32 re-measurement), so it must not have side effects. The result is stored in Out with the
    /// op's multiplier, saturating.
    template <ScaledElement Out, class Compute>
    [[nodiscard]] ScaledArray<Out, Policy> apply(op_handle op, Compute&& compute)
    {
        op_record& r = m_ops[checked(op)];
        if (m_inference) {
            if (r.analysis_measurements == 0) return detail::saturating_cast<Out>(unrecorded_analysis(r, compute));
            return held<Out>(r, compute).first;
        }
        if (begin_use(r)) return detail::saturating_cast<Out>(analyse(r, compute));
        return low_precision<Out>(r, compute);
    }
    /// As above with a runtime output type; float32 while the op analyses.
    template <class Compute>
    [[nodiscard]] any_scaled_array<Policy> apply(op_handle op, dtype out, Compute&& compute)
    {
        op_record& r = m_ops[checked(op)];
        if (m_inference && r.analysis_measurements == 0) return unrecorded_analysis(r, compute);
        if (!m_inference && begin_use(r)) return analyse(r, compute);
        return detail::with_dtype(out, [&](auto tag) -> any_scaled_array<Policy> {
            if (m_inference) return held<decltype(tag)>(r, compute).first;
            return low_precision<decltype(tag)>(r, compute);
        });
    }

    /// Inference (evaluation) uses: not counted, never measured, so they leave every schedule as it
    /// is; an op runs with its multiplier, or in float32 if it never analysed. Off by default.
    void set_inference(bool on) noexcept { m_inference = on; }
    [[nodiscard]] bool inference() const noexcept { return m_inference; }

    // ---- checks and report ------------------------------------------------------------------

    /// The next use of every op, frozen ones included, re-measures and compares with its multiplier
    /// (warning as a re-measurement does). A check only: multipliers and results stay as they are,
    /// unless the result saturated; the measurement goes to the history.
    void final_check()
    {
        for (auto& op : m_ops) op.final_check_pending = true;
    }

    void set_warning_handler(warning_handler handler) { m_handler = std::move(handler); }
    [[nodiscard]] const std::vector<warning>& warnings() const noexcept { return m_warnings; }
    [[nodiscard]] const context_config& config() const noexcept { return m_config; }
    [[nodiscard]] const std::string& strategy() const noexcept { return m_strategy_name; }
    [[nodiscard]] std::size_t size() const noexcept { return m_ops.size(); }

    [[nodiscard]] scaling_report report() const
    {
        return scaling_report{m_strategy_name, m_config, std::vector<op_record>(m_ops.begin(), m_ops.end()), m_warnings};
    }

private:
    [[nodiscard]] std::size_t checked(op_handle handle) const
    {
        if (handle.m_owner != this || handle.m_index >= m_ops.size()) {
            SCALIFY_THROW(config_error("autoscale::scaling_context: the op handle belongs to another context (or none)"));
            return 0;
        }
        return handle.m_index;
    }

    /// The scalify-primitive view of a cast: natural scale x.scale, raw data x.data.
    template <class T>
    [[nodiscard]] static auto cast_compute(const ScaledArray<T, Policy>& x)
    {
        return [&x]<class S>(strategy_tag<S>) {
            scale_request request;
            request.natural = x.scale();
            request.input_scales[0] = x.scale();
            const float scale = scalify::detail::checked_output_scale<Policy>(
                scaling_traits<ops::cast, S>::template output_scale<Policy>(request), "autoscale cast", request);
            xt::xarray<float> data = xt::xarray<float>::from_shape(x.shape());
            const std::size_t n = x.size();
            if (scale == 0.0f || request.natural == 0.0f) {
                std::fill_n(data.data(), n, 0.0f);
                return ScaledArray<float, Policy>(std::move(data), 0.0f);
            }
            const auto k = static_cast<float>(double(request.natural) / double(scale));
            const T* in = x.data().data();
            float* out = data.data();
            for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(scalify::detail::load(in[i])) * k;
            return ScaledArray<float, Policy>(std::move(data), scale);
        };
    }

    /// A cast use after analysis: one pass straight into Out when nothing is measured.
    template <ScaledElement Out, class T>
    [[nodiscard]] ScaledArray<Out, Policy> held_cast(op_record& op, const ScaledArray<T, Policy>& x)
    {
        if (!m_inference && measuring(op)) {
            auto compute = cast_compute(x);
            return low_precision<Out>(op, compute);
        }
        const float natural = x.scale();
        xt::xarray<Out> data = xt::xarray<Out>::from_shape(x.shape());
        const std::size_t n = x.size();
        Out* out = data.data();
        if (natural == 0.0f) {
            for (std::size_t i = 0; i < n; ++i) out[i] = scalify::detail::store<Out>(0.0f);
            return ScaledArray<Out, Policy>(std::move(data), 0.0f);
        }
        const float scale = output_scale(op, natural, op.prop_scale);
        const auto k = static_cast<float>(double(natural) / double(scale));
        const T* in = x.data().data();
        for (std::size_t i = 0; i < n; ++i) {
            out[i] = convert<Out, round_nearest_even, saturate_finite>(static_cast<float>(scalify::detail::load(in[i])) * k);
        }
        return ScaledArray<Out, Policy>(std::move(data), scale);
    }

    /// Whether this (already counted) use after analysis re-measures.
    [[nodiscard]] bool measuring(const op_record& op) const noexcept
    {
        return op.final_check_pending ||
               (op.phase == op_phase::on && op.period > 0 && (op.uses - m_config.analysis_iters) % op.period == 0);
    }

    template <class Compute, class S>
    [[nodiscard]] static ScaledArray<float, Policy> call(Compute& compute, strategy_tag<S> tag)
    {
        using R = std::remove_cvref_t<decltype(compute(tag))>;
        static_assert(AnyScaledArray<R> && std::same_as<typename R::scale_policy, Policy>,
                      "autoscale: the compute callable must return a ScaledArray under the context's scale policy "
                      "(best ScaledArray<float, Policy>: call the primitive with Out = float where it has one)");
        if constexpr (std::same_as<typename R::value_type, float>) return compute(tag);
        else return cast<float>(compute(tag));
    }

    /// Counts the use; true when it is an analysis use. Decides the waiting ops' periods when an op
    /// that finished its analysis comes back.
    bool begin_use(op_record& op)
    {
        ++op.uses;
        const std::size_t analysis = m_config.analysis_iters;
        if (op.phase == op_phase::analysing && op.uses <= analysis) {
            op.final_check_pending = false;  // an analysis use measures anyway
            return true;
        }
        if (op.phase == op_phase::analysing) decide();
        return false;
    }

    /// Every analysing op with its analysis complete gets its period from the strategy.
    void decide()
    {
        std::vector<op_record*> cohort;
        std::vector<op_summary> summaries;
        for (auto& op : m_ops) {
            if (op.phase != op_phase::analysing || op.uses < m_config.analysis_iters) continue;
            cohort.push_back(&op);
            op_summary s;
            s.name = op.name;
            s.measurements = op.analysis_measurements;
            s.mean_log2 = op.mean_log2;
            if (op.analysis_measurements > 1) {
                s.stddev_log2 = std::sqrt(op.m2_log2 / double(op.analysis_measurements - 1));
                s.range_log2 = op.max_log2 - op.min_log2;
                s.max_step_log2 = op.max_step_log2;
            }
            summaries.push_back(s);
        }
        const std::vector<std::size_t> periods = m_schedule(summaries);
        if (periods.size() != cohort.size()) {
            SCALIFY_THROW(config_error(fmt::format("autoscale: the rescale strategy returned {} periods for {} ops",
                                                   periods.size(), cohort.size())));
            return;
        }
        for (std::size_t i = 0; i < cohort.size(); ++i) {
            op_record& op = *cohort[i];
            op.period = periods[i];
            op.phase = periods[i] == 0 ? op_phase::frozen : op_phase::on;
            if (op.phase == op_phase::frozen && op.analysis_measurements > 0) {
                op.prop_scale = static_cast<float>(std::exp2(op.mean_log2));
            }
        }
    }

    /// The output scale natural * prop under Policy; scale_error when it leaves float's range.
    [[nodiscard]] static float output_scale(const op_record& op, float natural, double prop)
    {
        const double wanted = double(natural) * prop;
        const float scale = Policy::from_rule(static_cast<float>(wanted));
        if (!std::isfinite(scale) || !(scale > 0.0f)) {
            SCALIFY_THROW(scale_error(fmt::format("autoscale op '{}': output scale {} * propagation scale {} = {} is "
                                                  "outside float32's range",
                                                  op.name, natural, prop, wanted)));
            return 1.0f;
        }
        return scale;
    }

    /// raw (natural scale, raw data) stored as natural * prop, data raw * natural / scale, in float.
    [[nodiscard]] static ScaledArray<float, Policy> normalise(const op_record& op, ScaledArray<float, Policy>&& raw, double prop)
    {
        const float natural = raw.scale();
        if (natural == 0.0f) return std::move(raw);
        const float scale = output_scale(op, natural, prop);
        const auto k = static_cast<float>(double(natural) / double(scale));
        xt::xarray<float> data = std::move(raw).release_data();
        if (k != 1.0f) {
            for (auto& v : data) v *= k;
        }
        return ScaledArray<float, Policy>(std::move(data), scale);
    }

    /// An analysis use: float32, measured.
    template <class Compute>
    [[nodiscard]] ScaledArray<float, Policy> analyse(op_record& op, Compute& compute)
    {
        ScaledArray<float, Policy> raw = call(compute, strategy_tag<natural_scaling>{});
        const auto stat = detail::measure(raw.data(), m_config.norm, std::numeric_limits<double>::infinity());
        if (raw.scale() > 0.0f && detail::usable(stat.norm)) {
            const double x = std::log2(stat.norm);
            const std::size_t n = ++op.analysis_measurements;
            if (n == 1) {
                op.min_log2 = op.max_log2 = x;
            } else {
                op.min_log2 = std::min(op.min_log2, x);
                op.max_log2 = std::max(op.max_log2, x);
                op.max_step_log2 = std::max(op.max_step_log2, std::abs(x - op.last_log2));
            }
            op.last_log2 = x;
            const double delta = x - op.mean_log2;
            op.mean_log2 += delta / double(n);
            op.m2_log2 += delta * (x - op.mean_log2);
            op.prop_scale = static_cast<float>(stat.norm);
            op.history.push_back({op.uses, event::analysis, op.prop_scale, false});
        }
        return normalise(op, std::move(raw), op.prop_scale);
    }

    /// An inference use of an op that never analysed: float32, measured for this use only.
    template <class Compute>
    [[nodiscard]] ScaledArray<float, Policy> unrecorded_analysis(const op_record& op, Compute& compute)
    {
        ScaledArray<float, Policy> raw = call(compute, strategy_tag<natural_scaling>{});
        const auto stat = detail::measure(raw.data(), m_config.norm, std::numeric_limits<double>::infinity());
        return normalise(op, std::move(raw), detail::usable(stat.norm) ? stat.norm : 1.0);
    }

    /// The op in Out with the held multiplier, and its natural scale.
    template <ScaledElement Out, class Compute>
    [[nodiscard]] std::pair<ScaledArray<Out, Policy>, float> held(const op_record& op, Compute& compute)
    {
        detail::held_guard guard(op.prop_scale);
        ScaledArray<float, Policy> r = call(compute, strategy_tag<held_scaling>{});
        const float natural = detail::held().natural;
        if (std::isnan(natural)) {
            SCALIFY_THROW(config_error(fmt::format(
                "autoscale op '{}': the compute callable did not run a scalify primitive with the strategy it was given",
                op.name)));
        }
        return {detail::saturating_cast<Out>(std::move(r)), natural};
    }

    /// A use after analysis: the op in Out with the held multiplier; measured when scheduled.
    template <ScaledElement Out, class Compute>
    [[nodiscard]] ScaledArray<Out, Policy> low_precision(op_record& op, Compute& compute)
    {
        const bool final_check = op.final_check_pending;
        const bool measure = measuring(op);
        op.final_check_pending = false;
        const double held_scale = op.prop_scale;
        auto [out, natural] = held<Out>(op, compute);
        if (!measure || natural == 0.0f) return std::move(out);

        // The statistic of the low-precision result: its data should have norm 1.
        const auto stat = detail::measure(out.data(), m_config.norm, detail::saturation_bound<Out>());
        const bool saturated = stat.non_finite > 0 || stat.saturated > 0;
        double measured = out.scale() > 0.0f ? stat.norm * double(out.scale()) / double(natural) : 0.0;
        const bool trusted = !saturated && stat.norm > 0.0 && detail::usable(measured) &&
                             std::abs(std::log2(stat.norm)) <= m_config.warn_log2;
        // A final check only looks: unless this result is broken (saturated or non-finite), the op keeps
        // its multiplier and its result, so that ops downstream are checked on the data they trained on.
        const bool adopt = !final_check || saturated;
        if (!trusted) {
            // "Slightly more involved": one float32 run measures exactly and re-stores this use's result.
            ++op.fallbacks;
            ScaledArray<float, Policy> raw = call(compute, strategy_tag<natural_scaling>{});
            const auto exact = detail::measure(raw.data(), m_config.norm, std::numeric_limits<double>::infinity());
            measured = exact.norm;
            if (raw.scale() > 0.0f && detail::usable(measured)) {
                if (adopt) out = detail::saturating_cast<Out>(normalise(op, std::move(raw), measured));
            } else {
                measured = 0.0;  // a zero (or non-finite) result: nothing to learn, keep the multiplier
            }
        }
        ++op.remeasurements;
        const event kind = final_check ? event::final_check : event::remeasure;
        if (measured > 0.0) {
            const double change = std::log2(measured / held_scale);
            const bool warn = saturated || std::abs(change) > m_config.warn_log2;
            if (adopt) op.prop_scale = static_cast<float>(measured);
            op.history.push_back({op.uses, kind, static_cast<float>(measured), warn});
            if (warn) {
                ++op.warnings;
                warning w{op.name, op.uses, static_cast<float>(held_scale), static_cast<float>(measured),
                          op.phase == op_phase::frozen, final_check, saturated};
                m_warnings.push_back(w);
                if (m_handler) m_handler(m_warnings.back());
            }
        }
        return std::move(out);
    }

    context_config m_config;
    std::string m_strategy_name;
    std::function<std::vector<std::size_t>(std::span<const op_summary>)> m_schedule;
    std::deque<op_record> m_ops;
    std::map<std::string, std::size_t, std::less<>> m_index;
    std::vector<warning> m_warnings;
    warning_handler m_handler;
    bool m_inference = false;
};

// ---------------------------------------------------------------------------------------------
// Scaled layers

/// y = x @ w (bias-free, as in the design), with weights (in, out) kept in float32 and cast by the
/// layer's weight op `<name>.w` at each call; the matmul is op `<name>.y`, whose multiplier is
/// prop_scale(): y.scale = x.scale * w.scale * prop_scale, y.data = x.data @ w.data / prop_scale.
/// float32 while analysing, F after.
template <ScaledElement F = float8_e4m3fn, ScalePolicy Policy = pow2_scale>
class linear {
public:
    /// shape_error unless weight is 2-D.
    linear(scaling_context<Policy>& context, std::string_view name, xt::xarray<float> weight)
        : m_context(&context), m_weight(std::move(weight)), m_w(context.op(std::string(name) + ".w")),
          m_y(context.op(std::string(name) + ".y"))
    {
        if (m_weight.dimension() != 2) {
            SCALIFY_THROW(shape_error(fmt::format("autoscale::linear '{}': weight must be 2-D (in, out), got shape {}", name,
                                                  shape_string(m_weight.shape()))));
        }
    }

    /// x (batch, in) -> y (batch, out).
    [[nodiscard]] any_scaled_array<Policy> operator()(const any_scaled_array<Policy>& x)
    {
        const any_scaled_array<Policy> w = scaled_weight();
        return m_context->apply(m_y, dtype_of<F>, [&]<class S>(strategy_tag<S>) {
            return std::visit(
                [&](const auto& xa) {
                    if (const auto* wf = std::get_if<ScaledArray<float, Policy>>(&w.variant())) return scalify::matmul<S, float>(xa, *wf);
                    return scalify::matmul<S, float>(xa, std::get<ScaledArray<F, Policy>>(w.variant()));
                },
                x.variant());
        });
    }

    /// The weight through its cast op (scale = norm of the weight).
    [[nodiscard]] any_scaled_array<Policy> scaled_weight()
    {
        return m_context->scale(m_w, ScaledArray<float, Policy>(m_weight, 1.0f), dtype_of<F>);
    }

    [[nodiscard]] float prop_scale() const { return m_context->record(m_y).prop_scale; }
    [[nodiscard]] const xt::xarray<float>& weight() const noexcept { return m_weight; }
    [[nodiscard]] xt::xarray<float>& weight() noexcept { return m_weight; }
    [[nodiscard]] op_handle weight_op() const noexcept { return m_w; }
    [[nodiscard]] op_handle output_op() const noexcept { return m_y; }

private:
    static_assert(RuntimeDtype<F>, "autoscale::linear: F must be float, Eigen::half, Eigen::bfloat16 or an fp8 type");
    scaling_context<Policy>* m_context;
    xt::xarray<float> m_weight;
    op_handle m_w;
    op_handle m_y;
};

}  // namespace scalify::autoscale
