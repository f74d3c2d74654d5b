#pragma once
/// \file loss_scaler.hpp
/// Automatic loss scaling with torch.cuda.amp.GradScaler's semantics: multiply the loss by a large
/// scale so small gradients survive a low-precision backward pass, unscale the gradients before
/// the optimiser step, skip the step and back off when any gradient is inf/NaN, grow the scale
/// again after `growth_interval` clean steps.
///
///     loss_scaler scaler;                          // 2^16, x2, x0.5, 2000 steps
///     auto loss = scaler.scale(raw_loss);          // ScaledArray: folds into the scale, data untouched
///     ... backward ...
///     if (!scaler.unscale(grads)) sgd_step(...);   // unscale returns found_inf
///     scaler.update();

#include <scalify/dist/reducer.hpp>
#include <scalify/error.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <cmath>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace scalify {

struct loss_scaler_config {
    float init_scale = 65536.0f;   ///< 2^16
    float growth_factor = 2.0f;    ///< > 1
    float backoff_factor = 0.5f;   ///< in (0, 1)
    int growth_interval = 2000;    ///< clean steps before growing, > 0
    float min_scale = 0.0f;        ///< floor on backoff (0: none), as asked in torch #99640
};

/// The scaler's whole state: what a checkpoint saves.
struct loss_scaler_state {
    float scale = 65536.0f;
    int growth_tracker = 0;  ///< clean steps since the last growth or backoff
    friend bool operator==(const loss_scaler_state&, const loss_scaler_state&) = default;
};

class loss_scaler {
public:
    explicit loss_scaler(loss_scaler_config config = {}) : m_config(config)
    {
        const auto bad = [](const char* name, auto value, const auto& rule) {
            SCALIFY_THROW(config_error(fmt::format("loss_scaler: {} must be {}, got {}", name, rule, value)));
        };
        if (!(config.init_scale > 0.0f) || !std::isfinite(config.init_scale)) bad("init_scale", config.init_scale, "finite and > 0");
        if (!(config.growth_factor > 1.0f) || !std::isfinite(config.growth_factor)) bad("growth_factor", config.growth_factor, "finite and > 1");
        if (!(config.backoff_factor > 0.0f && config.backoff_factor < 1.0f)) bad("backoff_factor", config.backoff_factor, "in (0, 1)");
        if (config.growth_interval <= 0) bad("growth_interval", config.growth_interval, "> 0");
        if (!(config.min_scale >= 0.0f) || !std::isfinite(config.min_scale)) bad("min_scale", config.min_scale, "finite and >= 0");
        if (config.min_scale > config.init_scale) bad("init_scale", config.init_scale, fmt::format(">= min_scale ({})", config.min_scale));
        m_state.scale = config.init_scale;
    }

    [[nodiscard]] float scale() const noexcept { return m_state.scale; }
    [[nodiscard]] const loss_scaler_config& config() const noexcept { return m_config; }
    [[nodiscard]] loss_scaler_state state() const noexcept { return m_state; }
    /// Whether the last unscale saw a non-finite gradient (the step must then be skipped).
    [[nodiscard]] bool found_inf() const noexcept { return m_found_inf; }
    [[nodiscard]] bool should_step() const noexcept { return !m_found_inf; }

    /// loss * scale. For a ScaledArray the factor folds into the scale (data unchanged).
    [[nodiscard]] float scale(float loss) const noexcept { return loss * m_state.scale; }
    template <class T, class P>
    [[nodiscard]] ScaledArray<T, P> scale(const ScaledArray<T, P>& loss) const
    {
        return mul(loss, static_cast<double>(m_state.scale));
    }

    /// Divides every gradient by the scale, in place, and records found_inf: true if any value is
    /// inf or NaN (a zero-scale array is zeros and never is) on any rank of dist::current_reducer(),
    /// so every rank of a data-parallel job skips the same steps, as GradScaler all-reduces its
    /// found_inf. ScaledArray gradients are unscaled by their scale, not their data. Returns found_inf.
    template <class T, class P>
    bool unscale(std::vector<ScaledArray<T, P>>& grads)
    {
        bool found = false;
        for (const auto& g : grads) found = found || !all_finite(g);
        for (auto& g : grads) g = div(g, static_cast<double>(m_state.scale));
        found = dist::current_reducer().any(found);
        m_found_inf = found;
        return found;
    }
    template <class T, class P>
    bool unscale(ScaledArray<T, P>& grad)
    {
        std::vector<ScaledArray<T, P>> one{grad};
        const bool found = unscale(one);
        grad = std::move(one.front());
        return found;
    }
    /// Plain float gradients: multiplied by 1 / scale.
    bool unscale(std::span<float> grads)
    {
        bool found = false;
        const float inverse = 1.0f / m_state.scale;
        for (float& g : grads) {
            found = found || !std::isfinite(g);
            g *= inverse;
        }
        found = dist::current_reducer().any(found);
        m_found_inf = found;
        return found;
    }

    /// After each step: back off (and restart counting) if the last unscale found inf/NaN,
    /// else count a clean step and grow after growth_interval of them.
    void update() noexcept
    {
        if (m_found_inf) {
            m_state.scale = std::max(m_state.scale * m_config.backoff_factor, m_config.min_scale);
            m_state.growth_tracker = 0;
        } else if (++m_state.growth_tracker == m_config.growth_interval) {
            const float grown = m_state.scale * m_config.growth_factor;
            m_state.scale = std::isfinite(grown) ? grown : m_state.scale;  // as GradScaler: never to inf
            m_state.growth_tracker = 0;
        }
        m_found_inf = false;
    }

    /// Restore a checkpoint (config_error for a scale that is not finite and > 0).
    void load_state(const loss_scaler_state& state)
    {
        if (!(state.scale > 0.0f) || !std::isfinite(state.scale) || state.growth_tracker < 0) {
            SCALIFY_THROW(config_error(fmt::format("loss_scaler: invalid state scale={} growth_tracker={}", state.scale,
                                                   state.growth_tracker)));
        }
        m_state = state;
        m_found_inf = false;
    }

    /// Text form of state(), exact (the scale as a hex float): "scale=0x1p+16 growth_tracker=12".
    [[nodiscard]] std::string save() const { return fmt::format("scale={:a} growth_tracker={}", m_state.scale, m_state.growth_tracker); }
    void restore(const std::string& text)
    {
        loss_scaler_state state;
        const auto scale_at = text.find("scale=");
        const auto tracker_at = text.find("growth_tracker=");
        if (scale_at == std::string::npos || tracker_at == std::string::npos) {
            SCALIFY_THROW(config_error(fmt::format("loss_scaler: cannot parse state '{}'", text)));
        }
        state.scale = std::strtof(text.c_str() + scale_at + 6, nullptr);
        state.growth_tracker = std::atoi(text.c_str() + tracker_at + 15);
        load_state(state);
    }

private:
    template <class T, class P>
    [[nodiscard]] static bool all_finite(const ScaledArray<T, P>& g)
    {
        if (g.scale() == 0.0f) return true;
        for (const auto& x : g.data()) {
            if (!std::isfinite(static_cast<double>(detail::load(x)))) return false;
        }
        return true;
    }

    loss_scaler_config m_config;
    loss_scaler_state m_state;
    bool m_found_inf = false;
};

}  // namespace scalify
