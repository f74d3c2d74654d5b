#pragma once
/// \file sgd.hpp
/// Stochastic gradient descent over parameter trees (see autodiff/grad.hpp): each parameter
/// leaf p (a ScaledArray) moves by -learning_rate * g, with g its ad::gradient.
///
/// - float32 / float64 parameters (master weights): the update is computed in the parameter's
///   type and stored under the parameter's own scale, as `w -= lr * g` would.
/// - low-precision parameters (fp8, fp16, bf16): the new value is rounded to nearest even,
///   saturating, under the parameter's scale; an update smaller than half a unit in the last
///   place is lost, which is why training keeps float32 masters and casts them forward.
///
///     ad::sgd optimizer{0.1};
///     optimizer.step(params, grads);

#include <scalify/autodiff/grad.hpp>
#include <scalify/autodiff/gradient.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/policies.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstddef>

namespace scalify::ad {

class sgd {
public:
    /// config_error unless learning_rate is finite.
    explicit sgd(double learning_rate) : m_learning_rate(learning_rate)
    {
        if (!std::isfinite(learning_rate)) {
            SCALIFY_THROW(config_error(fmt::format("sgd: learning_rate must be finite, got {}", learning_rate)));
        }
    }

    [[nodiscard]] double learning_rate() const noexcept { return m_learning_rate; }
    void set_learning_rate(double learning_rate)
    {
        *this = sgd(learning_rate);
    }

    /// params -= learning_rate * grads, leaf by leaf; shape_error when the trees or a leaf's
    /// shapes differ.
    template <class Params, class Grads>
    void step(Params& params, const Grads& grads) const
    {
        auto update = [this](auto& p, const auto& g) { this->apply(p, g); };
        detail::tree_zip(params, grads, update);
    }

private:
    template <class T, class P>
    void apply(ScaledArray<T, P>& p, const gradient<P>& g) const
    {
        g.visit_widened([&](const auto& ga) {  // computed in the parameter's type: float32 and float64 gradients suffice
            if (!std::equal(ga.shape().begin(), ga.shape().end(), p.shape().begin(), p.shape().end())) {
                SCALIFY_THROW(shape_error(fmt::format("sgd: gradient of shape {} for a parameter of shape {}",
                                                      shape_string(ga.shape()), shape_string(p.shape()))));
            }
            using C = compute_t<T>;
            const C lr = static_cast<C>(m_learning_rate);
            const C g_scale = static_cast<C>(ga.scale());
            const C inv_p_scale = p.scale() == 0.0f ? C(0) : static_cast<C>(1.0 / double(p.scale()));
            xt::xarray<T> data = std::move(p).release_data();
            const auto* gd = ga.data().data();
            T* pd = data.data();
            const std::size_t n = data.size();
            const C p_scale = static_cast<C>(p.scale());
            for (std::size_t i = 0; i < n; ++i) {
                const C step = lr * (static_cast<C>(scalify::detail::load(gd[i])) * g_scale);
                if constexpr (std::same_as<T, float> || std::same_as<T, double>) {
                    pd[i] = p_scale == C(1) ? pd[i] - step : (pd[i] * p_scale - step) * inv_p_scale;
                } else {
                    pd[i] = convert<T, round_nearest_even, saturate_finite>(
                        (scalify::detail::load(pd[i]) * p_scale - step) * inv_p_scale);
                }
            }
            p = ScaledArray<T, P>(std::move(data), p.scale());
        });
    }

    double m_learning_rate;
};

}  // namespace scalify::ad
