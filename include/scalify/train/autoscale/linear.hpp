#pragma once
/// \file train/autoscale/linear.hpp
/// autoscale::linear: a bias-free layer whose weight cast and matmul are two ops of a
/// scaling_context.

#include <scalify/error.hpp>
#include <scalify/train/autoscale/context.hpp>

#include <cstddef>
#include <string>
#include <utility>

namespace scalify::autoscale {

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
