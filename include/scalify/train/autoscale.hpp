#pragma once
/// \file autoscale.hpp
/// AutoScale (seed "Scale propagation proposal B"): learn each op's *propagation scale* (the RMS
/// of its output divided by the product of its input scales) empirically, then reuse it.
///
/// 1. Analysis: an op's first `analysis_iters` uses measure the propagation scale in float32
///    (and use it) and collect its mean and variance in log2.
/// 2. Rescale strategy, once the first op leaves analysis:
///    - conservative (default): every op is re-measured at every use;
///    - on_off(op_freq, loop_freq): the fraction op_freq of ops with the most stable scale
///      (lowest log2 variance) is frozen at its analysis mean and not measured again; the others
///      hold their last measurement and are re-measured every round(1 / loop_freq) uses.
/// 3. A re-measured scale more than `warn_log2` binades away from the held one calls the warning
///    handler (user-replaceable; default prints to stderr): data that drift that far risk over- or
///    underflow in a narrow format.
/// 4. request_final_check(): the next use of every op, frozen ones included, re-measures and
///    compares, so a run ends with a full check.
///
///     autoscale<pow2_scale> scaler(autoscale_config::on_off(0.5, 0.1));
///     auto y = scaler.run<float8_e4m3fn>("fc1", x.scale() * w.scale(), [&] { return matmul<natural_scaling, float>(x, w).value(); });

#include <scalify/error.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace scalify {

struct autoscale_config {
    std::size_t analysis_iters = 10;
    double op_freq = 0.0;    ///< share of ops to freeze after analysis, [0, 1]
    double loop_freq = 1.0;  ///< non-frozen ops are re-measured every round(1 / loop_freq) uses, (0, 1]
    double warn_log2 = 2.0;  ///< warn when a re-measured scale moves by more than this many binades

    /// The seed's on/off strategy.
    [[nodiscard]] static autoscale_config on_off(double op_freq, double loop_freq)
    {
        autoscale_config config;
        config.op_freq = op_freq;
        config.loop_freq = loop_freq;
        return config;
    }
};

struct autoscale_warning {
    std::string op;
    std::size_t use = 0;      ///< 1-based use count of the op
    float held = 0.0f;        ///< the propagation scale in use
    float measured = 0.0f;    ///< what the data say now
    bool frozen = false;      ///< whether the op was frozen
    bool final_check = false; ///< raised by the final check
};

template <ScalePolicy Policy = pow2_scale>
class autoscale {
public:
    using warning_handler = std::function<void(const autoscale_warning&)>;

    struct op_state {
        std::size_t uses = 0;
        std::size_t measurements = 0;
        double mean_log2 = 0.0;  ///< over the analysis measurements (Welford)
        double m2_log2 = 0.0;
        float held = 1.0f;       ///< propagation scale in use
        bool frozen = false;
        bool recheck = false;
        [[nodiscard]] double variance_log2() const noexcept { return measurements > 1 ? m2_log2 / double(measurements - 1) : 0.0; }
    };

    explicit autoscale(autoscale_config config = {}) : m_config(config)
    {
        if (config.analysis_iters == 0) SCALIFY_THROW(config_error("autoscale: analysis_iters must be > 0, got 0"));
        if (!(config.op_freq >= 0.0 && config.op_freq <= 1.0)) {
            SCALIFY_THROW(config_error(fmt::format("autoscale: op_freq must be in [0, 1], got {}", config.op_freq)));
        }
        if (!(config.loop_freq > 0.0 && config.loop_freq <= 1.0)) {
            SCALIFY_THROW(config_error(fmt::format("autoscale: loop_freq must be in (0, 1], got {}", config.loop_freq)));
        }
        if (!(config.warn_log2 > 0.0)) {
            SCALIFY_THROW(config_error(fmt::format("autoscale: warn_log2 must be > 0, got {}", config.warn_log2)));
        }
        m_handler = [](const autoscale_warning& w) {
            std::fputs(fmt::format("scalify autoscale warning: op '{}' use {}: propagation scale {} -> {}{}\n", w.op, w.use,
                                   w.held, w.measured, w.final_check ? " (final check)" : "")
                           .c_str(),
                       stderr);
        };
    }

    void set_warning_handler(warning_handler handler) { m_handler = std::move(handler); }

    /// Runs one use of op `name`. compute() returns the op's result value in float32 (an xarray);
    /// input_scale is the product of the op's input scales. The result is stored in Out under
    /// scale Policy::from_rule(propagation * input_scale).
    template <ScaledElement Out, class Compute>
    [[nodiscard]] ScaledArray<Out, Policy> run(const std::string& name, float input_scale, Compute&& compute)
    {
        const xt::xarray<float> value = compute();
        op_state& op = m_ops[name];
        ++op.uses;
        if (!m_decided && op.uses > m_config.analysis_iters) decide();

        const bool analysing = op.uses <= m_config.analysis_iters;
        const std::size_t period = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(1.0 / m_config.loop_freq)));
        const bool remeasure = !analysing && (op.recheck || (!op.frozen && (op.uses - m_config.analysis_iters) % period == 0));
        if (analysing || remeasure) {
            const float measured = propagation_scale(value, input_scale);
            if (measured > 0.0f && std::isfinite(measured)) {
                if (analysing) {
                    ++op.measurements;
                    const double x = std::log2(double(measured));
                    const double delta = x - op.mean_log2;
                    op.mean_log2 += delta / double(op.measurements);
                    op.m2_log2 += delta * (x - op.mean_log2);
                    op.held = measured;
                } else {
                    if (std::abs(std::log2(double(measured) / double(op.held))) > m_config.warn_log2) {
                        ++m_warnings;
                        m_handler({name, op.uses, op.held, measured, op.frozen, op.recheck});
                    }
                    op.held = measured;
                }
            }
            op.recheck = false;
        }

        float scale = Policy::from_rule(static_cast<float>(double(op.held) * input_scale));
        if (!(scale > 0.0f) || !std::isfinite(scale)) scale = Policy::from_rule(1.0f);
        xt::xarray<Out> data = xt::xarray<Out>::from_shape(value.shape());
        const float inverse = 1.0f / scale;
        for (std::size_t i = 0; i < value.size(); ++i) data.data()[i] = detail::store<Out>(value.data()[i] * inverse);
        return ScaledArray<Out, Policy>(std::move(data), scale);
    }

    /// The next use of every op re-measures and compares (frozen ops included).
    void request_final_check()
    {
        for (auto& [name, op] : m_ops) op.recheck = true;
    }

    [[nodiscard]] const op_state& state(const std::string& name) const
    {
        const auto it = m_ops.find(name);
        if (it == m_ops.end()) SCALIFY_THROW(config_error(fmt::format("autoscale: no op named '{}'", name)));
        return it->second;
    }
    [[nodiscard]] std::size_t warnings() const noexcept { return m_warnings; }
    [[nodiscard]] const autoscale_config& config() const noexcept { return m_config; }

private:
    /// RMS of the value over the input scale product (NaN/inf elements ignored).
    [[nodiscard]] static float propagation_scale(const xt::xarray<float>& value, float input_scale)
    {
        double sum = 0.0;
        std::size_t n = 0;
        for (float v : value) {
            if (std::isfinite(v)) {
                sum += double(v) * double(v);
                ++n;
            }
        }
        if (n == 0 || !(input_scale > 0.0f)) return 0.0f;
        return static_cast<float>(std::sqrt(sum / double(n)) / double(input_scale));
    }

    /// Freeze the op_freq share of the ops seen so far with the lowest log2 variance.
    void decide()
    {
        m_decided = true;
        std::vector<std::pair<double, op_state*>> ranked;
        for (auto& [name, op] : m_ops) ranked.emplace_back(op.variance_log2(), &op);
        std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        const auto frozen = static_cast<std::size_t>(std::floor(m_config.op_freq * double(ranked.size())));
        for (std::size_t i = 0; i < frozen; ++i) {
            op_state& op = *ranked[i].second;
            op.frozen = true;
            if (op.measurements > 0) op.held = static_cast<float>(std::exp2(op.mean_log2));  // the analysis mean
        }
    }

    autoscale_config m_config;
    std::map<std::string, op_state> m_ops;
    warning_handler m_handler;
    bool m_decided = false;
    std::size_t m_warnings = 0;
};

}  // namespace scalify
