#pragma once
/// \file train/autoscale/context.hpp
/// scaling_context: AutoScale's per-op propagation scales (train/autoscale.hpp describes the
/// method), their analysis, re-measurement, warnings, final check and report.

#include <scalify/amp/any_scaled_array.hpp>
#include <scalify/error.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/matmul.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/scaling.hpp>
#include <scalify/train/autoscale/held_scaling.hpp>
#include <scalify/train/autoscale/report.hpp>
#include <scalify/train/autoscale/statistics.hpp>
#include <scalify/train/autoscale_strategy.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

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
        return scalify::visit_dtype(to, [&]<class To>() -> any_scaled_array<Policy> { return held_cast<To>(r, x); });
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
        return scalify::visit_dtype(to, [&]<class T>() -> any_scaled_array<Policy> {
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
        return scalify::visit_dtype(out, [&]<class T>() -> any_scaled_array<Policy> {
            if (m_inference) return held<T>(r, compute).first;
            return low_precision<T>(r, compute);
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

    /// A compute callable's two runs, with held_scaling and with natural_scaling, behind one
    /// function pointer: what surrounds them (analysis, measurement, fallback, the cast to the
    /// output type) is compiled once per output type, not once per callable, and every op's
    /// callable is a lambda, a type of its own. Refers to the callable: lives within one use.
    class compute_runs {
    public:
        template <class Compute>
            requires(!std::same_as<std::remove_cvref_t<Compute>, compute_runs>)
        compute_runs(Compute& compute) noexcept  // NOLINT: implicit, so that a use passes its callable as it is
            : m_callable(std::addressof(compute)), m_run([](const void* callable, bool natural) {
                  Compute& c = *static_cast<Compute*>(const_cast<void*>(callable));
                  return natural ? call(c, strategy_tag<natural_scaling>{}) : call(c, strategy_tag<held_scaling>{});
              })
        {
        }
        [[nodiscard]] ScaledArray<float, Policy> held() const { return m_run(m_callable, false); }
        [[nodiscard]] ScaledArray<float, Policy> natural() const { return m_run(m_callable, true); }

    private:
        const void* m_callable;
        ScaledArray<float, Policy> (*m_run)(const void*, bool);
    };

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
    [[nodiscard]] ScaledArray<float, Policy> analyse(op_record& op, const compute_runs& compute)
    {
        ScaledArray<float, Policy> raw = compute.natural();
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
    [[nodiscard]] ScaledArray<float, Policy> unrecorded_analysis(const op_record& op, const compute_runs& compute)
    {
        ScaledArray<float, Policy> raw = compute.natural();
        const auto stat = detail::measure(raw.data(), m_config.norm, std::numeric_limits<double>::infinity());
        return normalise(op, std::move(raw), detail::usable(stat.norm) ? stat.norm : 1.0);
    }

    /// The op in Out with the held multiplier, and its natural scale.
    template <ScaledElement Out>
    [[nodiscard]] std::pair<ScaledArray<Out, Policy>, float> held(const op_record& op, const compute_runs& compute)
    {
        detail::held_guard guard(op.prop_scale);
        ScaledArray<float, Policy> r = compute.held();
        const float natural = detail::held().natural;
        if (std::isnan(natural)) {
            SCALIFY_THROW(config_error(fmt::format(
                "autoscale op '{}': the compute callable did not run a scalify primitive with the strategy it was given",
                op.name)));
        }
        return {detail::saturating_cast<Out>(std::move(r)), natural};
    }

    /// A use after analysis: the op in Out with the held multiplier; measured when scheduled.
    template <ScaledElement Out>
    [[nodiscard]] ScaledArray<Out, Policy> low_precision(op_record& op, const compute_runs& compute)
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
            ScaledArray<float, Policy> raw = compute.natural();
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

}  // namespace scalify::autoscale
