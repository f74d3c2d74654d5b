#pragma once
/// \file adam.hpp
/// Adam with decoupled weight decay (AdamW, as torch.optim.AdamW) over parameter trees (see
/// autodiff/grad.hpp). For each parameter leaf p with gradient g (both as values, data x scale),
/// at step t = 1, 2, ...:
///
///     p -= lr * weight_decay * p                       (decoupled weight decay, before the step)
///     m  = beta1 * m + (1 - beta1) * g
///     v  = beta2 * v + (1 - beta2) * g * g
///     p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + epsilon)
///
/// - The moments m and v live in the value domain, in float32 (float64 for float64 parameters),
///   one pair per leaf, created at the first step in leaf order. A gradient's scale changes from
///   step to step (it is propagated, or set by a rule or a loss scale), so its data from two steps
///   are not on the same footing and cannot be averaged: data x scale are.
/// - The parameter is written back as sgd writes it: float32 / float64 masters keep their own
///   scale (new data = new value / scale); low-precision parameters round to nearest even,
///   saturating, under their scale. A parameter of scale 0 holds only zeros and keeps its scale,
///   so it stays zero (as under sgd): the optimizer does not choose parameters' scales.
/// - A non-finite gradient element makes its moments non-finite and its parameter NaN from then
///   on; skipping such steps is the loss scaler's job (train/loss_scaler.hpp).
///
///     ad::adam optimizer({.learning_rate = 1e-3, .weight_decay = 0.01});
///     optimizer.step(params, grads);

#include <scalify/autodiff/grad.hpp>
#include <scalify/autodiff/gradient.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/policies.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace scalify::ad {

/// Hyperparameters of ad::adam, with torch.optim.AdamW's names and meaning (its weight decay
/// default is 0.01; here 0, plain Adam, unless asked for).
struct adam_options {
    double learning_rate = 1e-3;
    double beta1 = 0.9;    ///< decay of the first moment (the mean of the gradients)
    double beta2 = 0.999;  ///< decay of the second moment (the mean of their squares)
    double epsilon = 1e-8;
    double weight_decay = 0.0;  ///< decoupled: p -= learning_rate * weight_decay * p before each step
};

class adam {
public:
    /// config_error naming the value unless learning_rate is finite, 0 <= beta1, beta2 < 1,
    /// epsilon > 0 (and finite) and weight_decay >= 0 (and finite).
    explicit adam(adam_options options) : m_options(options)
    {
        const auto require = [](bool ok, const char* what, double value) {
            if (!ok) SCALIFY_THROW(config_error(fmt::format("adam: {}, got {}", what, value)));
        };
        require(std::isfinite(options.learning_rate), "learning_rate must be finite", options.learning_rate);
        require(options.beta1 >= 0.0 && options.beta1 < 1.0, "beta1 must be in [0, 1)", options.beta1);
        require(options.beta2 >= 0.0 && options.beta2 < 1.0, "beta2 must be in [0, 1)", options.beta2);
        require(std::isfinite(options.epsilon) && options.epsilon > 0.0, "epsilon must be finite and > 0", options.epsilon);
        require(std::isfinite(options.weight_decay) && options.weight_decay >= 0.0,
                "weight_decay must be finite and >= 0", options.weight_decay);
    }

    [[nodiscard]] const adam_options& options() const noexcept { return m_options; }
    [[nodiscard]] double learning_rate() const noexcept { return m_options.learning_rate; }
    /// For schedules: the moments and the step count are kept. config_error unless finite.
    void set_learning_rate(double learning_rate)
    {
        adam_options changed = m_options;
        changed.learning_rate = learning_rate;
        m_options = adam(changed).m_options;
    }
    /// Steps taken so far (t of the bias correction is steps() + 1 during the next step).
    [[nodiscard]] std::size_t steps() const noexcept { return m_steps; }

    /// One AdamW step, leaf by leaf. shape_error, before anything changes, when the trees differ,
    /// a gradient's shape differs from its parameter's, or the tree's leaves (their count, shapes
    /// or float64-ness) differ from those of the first step; autodiff_error for an empty gradient.
    template <class Params, class Grads>
    void step(Params& params, const Grads& grads)
    {
        std::size_t leaf = 0;
        auto check = [&](auto& p, const auto& g) { this->check_leaf(leaf++, p, g); };
        detail::tree_zip(params, grads, check);
        if (!m_state.empty() && leaf != m_state.size()) {
            SCALIFY_THROW(shape_error(fmt::format("adam: the parameter tree has {} leaves, {} at the first step", leaf,
                                                  m_state.size())));
        }

        const bool first = m_state.empty();
        ++m_steps;
        const double t = static_cast<double>(m_steps);
        const step_constants constants{m_options, 1.0 - std::pow(m_options.beta1, t), 1.0 - std::pow(m_options.beta2, t)};
        leaf = 0;
        auto update = [&](auto& p, const auto& g) {
            if (first) m_state.push_back(zero_moments(p));
            this->apply(p, g, m_state[leaf++], constants);
        };
        detail::tree_zip(params, grads, update);
    }

private:
    /// Per-leaf moments, value domain, in the parameter's compute type.
    template <class M>
    struct moments {
        xt::xarray<M> first, second;
    };
    using leaf_state = std::variant<moments<float>, moments<double>>;

    /// What every element of a step shares: the options and the bias corrections 1 - beta^t.
    struct step_constants {
        adam_options options;
        double correction1, correction2;
    };

    template <class T, class P>
    static leaf_state zero_moments(const ScaledArray<T, P>& p)
    {
        using M = compute_t<T>;
        auto zeros = [&] {
            xt::xarray<M> z = xt::xarray<M>::from_shape(p.shape());
            std::fill(z.begin(), z.end(), M(0));
            return z;
        };
        return moments<M>{zeros(), zeros()};
    }

    template <class T, class P>
    void check_leaf(std::size_t leaf, const ScaledArray<T, P>& p, const gradient<P>& g) const
    {
        const std::vector<std::size_t> g_shape = g.shape();  // autodiff_error when empty
        if (!std::equal(g_shape.begin(), g_shape.end(), p.shape().begin(), p.shape().end())) {
            SCALIFY_THROW(shape_error(fmt::format("adam: leaf {}: gradient of shape {} for a parameter of shape {}", leaf,
                                                  shape_string(g_shape), shape_string(p.shape()))));
        }
        if (m_state.empty()) return;
        if (leaf >= m_state.size()) {
            SCALIFY_THROW(shape_error(fmt::format("adam: the parameter tree has more than the {} leaves of the first step",
                                                  m_state.size())));
        }
        using M = compute_t<T>;
        const auto* held = std::get_if<moments<M>>(&m_state[leaf]);
        if (held == nullptr) {
            SCALIFY_THROW(shape_error(fmt::format(
                "adam: leaf {}: the parameter's compute type changed since the first step (now {}, moments kept in {})", leaf,
                std::same_as<M, double> ? "float64" : "float32", std::same_as<M, double> ? "float32" : "float64")));
        }
        if (!std::equal(held->first.shape().begin(), held->first.shape().end(), p.shape().begin(), p.shape().end())) {
            SCALIFY_THROW(shape_error(fmt::format("adam: leaf {}: parameter of shape {}, of shape {} at the first step", leaf,
                                                  shape_string(p.shape()), shape_string(held->first.shape()))));
        }
    }

    template <class T, class P>
    static void apply(ScaledArray<T, P>& p, const gradient<P>& g, leaf_state& state, const step_constants& c)
    {
        using M = compute_t<T>;
        moments<M>& held = std::get<moments<M>>(state);
        // Narrow gradients widened to float first: W and every product are what their own types give.
        g.visit_widened([&](const auto& ga) {
            using G = typename std::remove_cvref_t<decltype(ga)>::value_type;
            using W = std::common_type_t<compute_t<G>, M>;  // a float64 gradient of a float32 parameter scales in double
            const W g_scale = static_cast<W>(ga.scale());
            const M beta1 = static_cast<M>(c.options.beta1), beta2 = static_cast<M>(c.options.beta2);
            const M one_minus_beta1 = static_cast<M>(1.0 - c.options.beta1);
            const M one_minus_beta2 = static_cast<M>(1.0 - c.options.beta2);
            const M decay = static_cast<M>(1.0 - c.options.learning_rate * c.options.weight_decay);
            const M step_size = static_cast<M>(c.options.learning_rate / c.correction1);
            const M correction2_sqrt = static_cast<M>(std::sqrt(c.correction2));
            const M epsilon = static_cast<M>(c.options.epsilon);
            const M p_scale = static_cast<M>(p.scale());

            const auto* gd = ga.data().data();
            M* md = held.first.data();
            M* vd = held.second.data();
            xt::xarray<T> data = std::move(p).release_data();
            T* pd = data.data();
            const std::size_t n = data.size();
            for (std::size_t i = 0; i < n; ++i) {
                const M grad = static_cast<M>(static_cast<W>(scalify::detail::load(gd[i])) * g_scale);
                md[i] = beta1 * md[i] + one_minus_beta1 * grad;
                vd[i] = beta2 * vd[i] + one_minus_beta2 * grad * grad;
                if (p_scale == M(0)) {
                    pd[i] = scalify::detail::store<T>(M(0));  // stays zero: see the file comment
                    continue;
                }
                M value = scalify::detail::load(pd[i]) * p_scale;
                value *= decay;
                value -= step_size * md[i] / (std::sqrt(vd[i]) / correction2_sqrt + epsilon);
                if constexpr (std::same_as<T, float> || std::same_as<T, double>) {
                    pd[i] = value / p_scale;
                } else {
                    pd[i] = convert<T, round_nearest_even, saturate_finite>(value / p_scale);
                }
            }
            p = ScaledArray<T, P>(std::move(data), p.scale());
        });
    }

    adam_options m_options;
    std::size_t m_steps = 0;
    std::vector<leaf_state> m_state;  ///< one per leaf, in leaf order; empty before the first step
};

}  // namespace scalify::ad
