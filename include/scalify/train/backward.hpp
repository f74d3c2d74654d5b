#pragma once
/// \file backward.hpp
/// Backward rules (vector-Jacobian products) of the differentiable primitives, as free functions
/// next to the ops: given the gradient g of a scalar loss with respect to an op's output (the
/// cotangent, always the first argument) and the forward values they need, they return the
/// gradients with respect to the op's inputs. Each stores its result under its own op tag,
/// ops::vjp<Op, Input> (strategy/scaling.hpp), so the Strategy argument gives gradients their own
/// scale rules; unit_scaling's keep unit-scale cotangents at unit scale (docs/ops.md).
///
/// matmul_vjp's two products are matmuls, each divided by the square root of its own contraction
/// (fan-out for the input gradient, batch for the weight gradient) under default_scaling and
/// unit_scaling. That is Graphcore unit-scaling's *unconstrained* rule (constraint=None); its
/// default constraint, "to_output_scale", gives both gradients the forward scale 1/sqrt(K)
/// instead, because there a scale changes the computed value and the backward pass must stay the
/// gradient of the scaled forward pass. Here a scale never changes a value, so every gradient can
/// take its own.
///
///     auto [ga, gb] = matmul_vjp(g, a, b);   // g.b^T, a^T.g

#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/matmul.hpp>
#include <scalify/ops/nn.hpp>
#include <scalify/ops/reduce.hpp>
#include <scalify/ops/shape.hpp>

#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ranges>
#include <type_traits>
#include <utility>
#include <vector>

namespace scalify {

template <class GA, class GB>
struct vjp_pair {
    GA first;   ///< gradient with respect to the first input
    GB second;  ///< gradient with respect to the second input
};

namespace detail {

/// g summed over the axes that broadcasting added or stretched, so it has `shape`, stored under
/// Op's rule (contraction: the elements summed per output). shape_error if `shape` does not
/// broadcast to g's shape.
template <class Strategy, class Op = ops::reduce_sum, class T, class P, class Shape>
[[nodiscard]] ScaledArray<T, P> unbroadcast(const ScaledArray<T, P>& g, const Shape& shape)
{
    const std::size_t rank = g.dimension();
    bool fits = shape.size() <= rank;
    const std::size_t lead = fits ? rank - shape.size() : 0;
    std::vector<std::size_t> axes;
    for (std::size_t d = 0; fits && d < rank; ++d) {
        if (d < lead) {
            axes.push_back(d);
        } else if (shape[d - lead] != g.shape()[d]) {
            fits = shape[d - lead] == 1;
            axes.push_back(d);
        }
    }
    if (!fits) {
        SCALIFY_THROW(shape_error(fmt::format("vjp: operand shape {} does not broadcast to the cotangent's shape {}",
                                              shape_string(shape), shape_string(g.shape()))));
    }
    if (axes.empty()) return g;
    using C = compute_t<T>;
    auto summed = reduce<Op, Strategy, T>("vjp", g, std::move(axes), C(0), sum_fn{});
    return reshape(summed, std::vector<std::size_t>(shape.begin(), shape.end()));
}

/// V(1) if `condition`, else V(0), as a mask on 1's bits. `V(x > 0)` compiles to a branch per
/// element in the VJP loops (GCC 12 does not if-convert it there), which made relu_vjp scalar and
/// 6 % of an fp32 training epoch; the mask keeps those loops in vector lanes.
template <class V>
    requires(std::same_as<V, float> || std::same_as<V, double>)
[[nodiscard]] constexpr V unit_if(bool condition) noexcept
{
    using bits = std::conditional_t<std::same_as<V, float>, std::uint32_t, std::uint64_t>;
    return std::bit_cast<V>(std::bit_cast<bits>(V(1)) & (bits{0} - bits{condition}));
}

/// g * f'(x) for a pointwise op, stored under Op's rule with g's type and policy (natural scale
/// sg; the request's input scales are {sg, sx}). `derivative` maps x's value to f'(x).
template <bool NeedsAmax, class G, class PG, class X, class PX, class Derivative>
[[nodiscard]] ScaledArray<G, PG> pointwise_vjp_by_rule(const char* op, const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x,
                                               scale_rule rule, Derivative derivative)
{
    using C = std::common_type_t<compute_t<G>, compute_t<X>>;
    const auto shape = broadcast_shapes(op, g.shape(), x.shape());
    xt::xarray<G> g_storage;
    xt::xarray<X> x_storage;
    const G* pg = broadcast_to(g.data(), shape, g_storage).data();
    const X* px = broadcast_to(x.data(), shape, x_storage).data();
    const C sx = static_cast<C>(x.scale());
    scale_request request;
    request.natural = g.scale();
    request.input_scales[0] = g.scale();
    request.input_scales[1] = x.scale();
    request.input_count = 2;
    return finish_by_rule<NeedsAmax, PG, G, C>(op, shape, request, rule, [=](std::size_t i) {
        const C xv = sx == C(0) ? C(0) : load(px[i]) * sx;  // a zero-scale x is zeros
        return load(pg[i]) * derivative(xv);
    });
}

/// The derivatives of the pointwise ops, as types of their own (see elementwise.hpp's plus_fn).
struct sign_fn {
    template <class V>
    V operator()(V v) const noexcept { return unit_if<V>(v > 0) - unit_if<V>(v < 0); }
};
struct step_fn {
    template <class V>
    V operator()(V v) const noexcept { return unit_if<V>(v > 0); }
};
struct gelu_derivative_fn {
    template <class C>
    C operator()(C v) const noexcept
    {
        const C cdf = C(0.5) * (C(1) + std::erf(v * C(0.70710678118654752440)));
        const C pdf = std::exp(C(-0.5) * v * v) * C(0.39894228040143267794);
        return cdf + v * pdf;
    }
};
struct tanh_derivative_fn {
    template <class V>
    V operator()(V v) const noexcept
    {
        const auto t = std::tanh(v);
        return V(1) - t * t;
    }
};

/// g * f'(x) under Strategy's rule for Op.
template <class Op, class Strategy, class G, class PG, class X, class PX, class Derivative>
[[nodiscard]] ScaledArray<G, PG> pointwise_vjp(const char* op, const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x,
                                               Derivative derivative)
{
    return pointwise_vjp_by_rule<needs_amax_v<Strategy>>(op, g, x, rule_for<Op, Strategy, PG>(), derivative);
}

template <class A, class B>
void require_same_shape(const char* op, const A& a, const B& b)
{
    if (!std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(), b.shape().end())) {
        SCALIFY_THROW(shape_error(fmt::format("{}: cotangent shape {} differs from the forward value's {}", op,
                                              shape_string(a.shape()), shape_string(b.shape()))));
    }
}

}  // namespace detail

// ---- binary -----------------------------------------------------------------------------------

namespace detail {

/// a with its last two axes swapped (a copy).
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> swap_last_axes(const ScaledArray<T, P>& a)
{
    std::vector<std::size_t> perm(a.dimension());
    for (std::size_t d = 0; d < perm.size(); ++d) perm[d] = d;
    std::swap(perm[perm.size() - 2], perm[perm.size() - 1]);
    return transpose(a, std::move(perm));
}

/// matmul_vjp of numpy's matmul (batched, broadcast, 1-D operands); only the gradients asked for
/// are formed (the others are left empty). A vector operand is its row (column) matrix; an
/// operand broadcast over batches gets the batches' gradients summed back (unbroadcast, whose
/// rule adds that sum to the product's contraction). With a 2-D second operand the batches' rows
/// form one 2-D product each way, as in the forward pass.
template <class Strategy, class Out, class G, class PG, class A, class PA, class B, class PB>
[[nodiscard]] auto batched_matmul_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b,
                                      bool need_a, bool need_b)
{
    const batched_shapes s(a.shape(), b.shape());
    if (!std::equal(g.shape().begin(), g.shape().end(), s.out.begin(), s.out.end())) {
        SCALIFY_THROW(shape_error(fmt::format("matmul_vjp: cotangent shape {} for the product of {} and {} (of shape {})",
                                              shape_string(g.shape()), shape_string(a.shape()), shape_string(b.shape()),
                                              shape_string(s.out))));
    }
    const std::size_t m = s.m, k = s.k, n = s.n;
    const auto matrix_b = s.b_vector ? with_shape(b, {k, 1}) : b;
    using GA = decltype(matmul_transposed_b<Strategy, Out>(g, b));
    using GB = decltype(matmul_transposed_a<Strategy, Out>(a, g));
    vjp_pair<GA, GB> result;
    const std::vector<std::size_t> a_shape(a.shape().begin(), a.shape().end());
    const std::vector<std::size_t> b_shape(b.shape().begin(), b.shape().end());
    if (s.b_batch.empty()) {
        const std::size_t rows = s.batch_count() * m;
        const auto g_rows = with_shape(g, {rows, n});
        if (need_a) result.first = with_shape(matmul_transposed_b<Strategy, Out>(g_rows, matrix_b), a_shape);
        if (need_b) result.second = with_shape(matmul_transposed_a<Strategy, Out>(with_shape(a, {rows, k}), g_rows), b_shape);
        return result;
    }
    std::vector<std::size_t> g_full = s.batch;
    g_full.insert(g_full.end(), {m, n});
    const auto g_matrices = with_shape(g, g_full);
    if (need_a) {
        std::vector<std::size_t> own = s.a_batch;
        own.insert(own.end(), {m, k});
        const auto full = matmul<Strategy, Out>(g_matrices, swap_last_axes(matrix_b));
        result.first = with_shape(unbroadcast<Strategy>(full, own), a_shape);
    }
    if (need_b) {
        const auto matrix_a = s.a_vector ? with_shape(a, {1, k}) : a;
        std::vector<std::size_t> own = s.b_batch;
        own.insert(own.end(), {k, n});
        const auto full = matmul<Strategy, Out>(swap_last_axes(matrix_a), g_matrices);
        result.second = with_shape(unbroadcast<Strategy>(full, own), b_shape);
    }
    return result;
}

}  // namespace detail

/// y = a.b: ga = g.b^T, gb = a^T.g; for batched and 1-D operands as numpy's matmul (gradients of
/// broadcast operands summed over the batches they were broadcast to).
template <class Strategy = default_scaling, class Out = void, class G, class PG, class A, class PA, class B, class PB>
[[nodiscard]] auto matmul_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    if (a.dimension() != 2 || b.dimension() != 2) return detail::batched_matmul_vjp<Strategy, Out>(g, a, b, true, true);
    auto ga = detail::matmul_transposed_b<Strategy, Out>(g, b);  // g.b^T, b read transposed in place
    auto gb = detail::matmul_transposed_a<Strategy, Out>(a, g);  // a^T.g
    return vjp_pair<decltype(ga), decltype(gb)>{std::move(ga), std::move(gb)};
}

/// y = a + b (broadcasting): ga = g, gb = g, each summed back to its operand's shape (a sum of N
/// cotangent elements: sqrt(N) under default_scaling and unit_scaling). Where no axis is summed,
/// the gradient is g itself, data and scale.
template <class Strategy = default_scaling, class G, class P, class SA, class SB>
[[nodiscard]] auto add_vjp(const ScaledArray<G, P>& g, const SA& a_shape, const SB& b_shape)
{
    return vjp_pair<ScaledArray<G, P>, ScaledArray<G, P>>{detail::unbroadcast<Strategy, ops::vjp<ops::add, 0>>(g, a_shape),
                                                          detail::unbroadcast<Strategy, ops::vjp<ops::add, 1>>(g, b_shape)};
}

/// y = a - b: ga = g, gb = -g.
template <class Strategy = default_scaling, class G, class P, class SA, class SB>
[[nodiscard]] auto sub_vjp(const ScaledArray<G, P>& g, const SA& a_shape, const SB& b_shape)
{
    return vjp_pair<ScaledArray<G, P>, ScaledArray<G, P>>{
        detail::unbroadcast<Strategy, ops::vjp<ops::sub, 0>>(g, a_shape),
        detail::unbroadcast<Strategy, ops::vjp<ops::sub, 1>>(neg(g), b_shape)};
}

/// y = a * b: ga = g * b, gb = g * a (each summed back over broadcast axes). The product of two
/// unit-scale operands is unit scale; a one-element factor scales it by its |value|.
template <class Strategy = default_scaling, class Out = void, class G, class PG, class A, class PA, class B, class PB>
[[nodiscard]] auto mul_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    using grad_a = ops::vjp<ops::mul, 0>;
    using grad_b = ops::vjp<ops::mul, 1>;
    auto ga = detail::unbroadcast<Strategy, grad_a>(detail::multiply<grad_a, Strategy, Out>("mul_vjp", g, b), a.shape());
    auto gb = detail::unbroadcast<Strategy, grad_b>(detail::multiply<grad_b, Strategy, Out>("mul_vjp", g, a), b.shape());
    return vjp_pair<decltype(ga), decltype(gb)>{std::move(ga), std::move(gb)};
}

/// y = a / b: ga = g / b, gb = -g * a / b^2.
template <class Strategy = default_scaling, class Out = void, class G, class PG, class A, class PA, class B, class PB>
[[nodiscard]] auto div_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    auto ga = detail::unbroadcast<Strategy>(div<Strategy, Out>(g, b), a.shape());
    auto gb = detail::unbroadcast<Strategy>(neg(div<Strategy, Out>(mul<Strategy, Out>(g, a), mul<Strategy, Out>(b, b))), b.shape());
    return vjp_pair<decltype(ga), decltype(gb)>{std::move(ga), std::move(gb)};
}

/// y = maximum(a, b): g goes to a where a >= b (ties to a), else to b.
template <class Strategy = default_scaling, class G, class PG, class A, class PA, class B, class PB>
[[nodiscard]] auto maximum_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    const auto shape = detail::broadcast_shapes("maximum_vjp", a.shape(), b.shape());
    const xt::xarray<bool> to_a = xt::broadcast(a.value(), shape) >= xt::broadcast(b.value(), shape);
    const auto zero = ScaledArray<G, PG>(xt::xarray<G>::from_shape({1}), 0.0f);
    auto ga = detail::unbroadcast<Strategy>(where<Strategy, G>(to_a, g, zero), a.shape());
    auto gb = detail::unbroadcast<Strategy>(where<Strategy, G>(to_a, zero, g), b.shape());
    return vjp_pair<decltype(ga), decltype(gb)>{std::move(ga), std::move(gb)};
}

/// y = minimum(a, b): g goes to a where a <= b (ties to a), else to b.
template <class Strategy = default_scaling, class G, class PG, class A, class PA, class B, class PB>
[[nodiscard]] auto minimum_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return maximum_vjp<Strategy>(g, neg(a), neg(b));
}

// ---- unary ------------------------------------------------------------------------------------

/// y = -x: -g.
template <class G, class P>
[[nodiscard]] ScaledArray<G, P> neg_vjp(const ScaledArray<G, P>& g)
{
    return neg(g);
}

/// y = |x|: g * sign(x) (0 at 0).
template <class Strategy = default_scaling, class G, class PG, class X, class PX>
[[nodiscard]] auto abs_vjp(const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x)
{
    return detail::pointwise_vjp<ops::vjp<ops::abs>, Strategy>("abs_vjp", g, x, detail::sign_fn{});
}

/// y = relu(x): g where x > 0, else 0 (also where x is NaN).
template <class Strategy = default_scaling, class G, class PG, class X, class PX>
[[nodiscard]] auto relu_vjp(const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x)
{
    return detail::pointwise_vjp<ops::vjp<ops::relu>, Strategy>("relu_vjp", g, x, detail::step_fn{});
}

/// y = gelu(x) (erf form): g * (Phi(x) + x phi(x)).
template <class Strategy = default_scaling, class G, class PG, class X, class PX>
[[nodiscard]] auto gelu_vjp(const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x)
{
    return detail::pointwise_vjp<ops::vjp<ops::gelu>, Strategy>("gelu_vjp", g, x, detail::gelu_derivative_fn{});
}

/// y = tanh(x), given x (as relu_vjp and gelu_vjp, so that the rule can follow x's scale):
/// g * (1 - tanh(x)^2).
template <class Strategy = default_scaling, class G, class PG, class X, class PX>
[[nodiscard]] auto tanh_vjp(const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x)
{
    return detail::pointwise_vjp<ops::vjp<ops::tanh>, Strategy>("tanh_vjp", g, x, detail::tanh_derivative_fn{});
}

/// y = exp(x), given y: g * y.
template <class Strategy = default_scaling, class G, class PG, class Y, class PY>
[[nodiscard]] auto exp_vjp(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y)
{
    return detail::multiply<ops::vjp<ops::exp>, Strategy, G>("exp_vjp", g, y);
}

/// y = log(x): g / x.
template <class Strategy = default_scaling, class G, class PG, class X, class PX>
[[nodiscard]] auto log_vjp(const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x)
{
    return detail::divide<ops::vjp<ops::log>, Strategy, G>("log_vjp", g, x);
}

/// y = sqrt(x), given y: g / (2 y).
template <class Strategy = default_scaling, class G, class PG, class Y, class PY>
[[nodiscard]] auto sqrt_vjp(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y)
{
    return detail::divide<ops::vjp<ops::sqrt>, Strategy, G>("sqrt_vjp", g, mul(y, 2.0));
}

// ---- reductions -------------------------------------------------------------------------------

/// y = reduce_sum(x, axes): g broadcast back over the summed axes of `shape` (data and scale
/// kept). shape_error for axes that are not distinct axes of `shape`.
template <class G, class P, class Shape>
[[nodiscard]] ScaledArray<G, P> reduce_sum_vjp(const ScaledArray<G, P>& g, const Shape& shape, std::vector<std::size_t> axes)
{
    const auto plan = detail::plan_reduction("reduce_sum_vjp", shape, std::move(axes));
    std::vector<std::size_t> kept(shape.begin(), shape.end());
    for (auto axis : plan.axes) kept[axis] = 1;
    const auto reshaped = reshape(g, kept);
    return ScaledArray<G, P>(xt::xarray<G>(xt::broadcast(reshaped.data(), std::vector<std::size_t>(shape.begin(), shape.end()))),
                             g.scale());
}

/// y = reduce_mean(x, axes): g / N broadcast back over the averaged axes of `shape` (N elements
/// per output): natural scale sg / N, data g's; unit_scaling keeps that (the data stay g's).
template <class Strategy = default_scaling, class G, class P, class Shape>
[[nodiscard]] ScaledArray<G, P> reduce_mean_vjp(const ScaledArray<G, P>& g, const Shape& shape, std::vector<std::size_t> axes)
{
    const auto plan = detail::plan_reduction("reduce_mean_vjp", shape, std::move(axes));
    std::vector<std::size_t> kept(shape.begin(), shape.end());
    for (auto axis : plan.axes) kept[axis] = 1;
    const std::vector<std::size_t> full(shape.begin(), shape.end());
    const xt::xarray<G> spread = xt::broadcast(reshape(g, kept).data(), full);
    scale_request request;
    request.natural = plan.count == 0 ? g.scale() : static_cast<float>(double(g.scale()) / double(plan.count));
    request.input_scales[0] = g.scale();
    request.single_values[0] = detail::single_magnitude(g);
    const G* data = spread.data();
    return detail::finish<ops::vjp<ops::reduce_mean>, Strategy, P, G, compute_t<G>>(
        "reduce_mean_vjp", full, request, [data](std::size_t i) { return detail::load(data[i]); });
}

// ---- softmax ----------------------------------------------------------------------------------

/// y = softmax(x, axis), given y: y * (g - sum_axis(g * y)), computed in one pass in compute_t
/// and stored once (natural scale sg * sy). shape_error unless g and y have the same shape.
template <class Strategy = default_scaling, class G, class PG, class Y, class PY>
[[nodiscard]] auto softmax_vjp(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y, std::size_t axis)
{
    using C = std::common_type_t<compute_t<G>, compute_t<Y>>;
    detail::require_same_shape("softmax_vjp", g, y);
    const detail::axis_lanes lanes("softmax_vjp", y.shape(), axis);
    const G* pg = g.data().data();
    const Y* py = y.data().data();
    const C sy = static_cast<C>(y.scale());
    std::vector<C> raw(y.size());
    lanes.for_each([&](std::size_t base, std::size_t stride) {
        C dot = 0;  // sum g y in data units; its value is sg * sy * dot
        for (std::size_t k = 0; k < lanes.length; ++k) dot += detail::load(pg[base + k * stride]) * detail::load(py[base + k * stride]);
        for (std::size_t k = 0; k < lanes.length; ++k) {
            const std::size_t i = base + k * stride;
            raw[i] = detail::load(py[i]) * (detail::load(pg[i]) - sy * dot);  // value: sg sy raw
        }
    });
    scale_request request;
    request.natural = static_cast<float>(double(g.scale()) * double(y.scale()));
    request.input_scales[0] = g.scale();
    request.input_scales[1] = y.scale();
    request.input_count = 2;
    request.axis_length = lanes.length;
    return detail::finish<ops::vjp<ops::softmax>, Strategy, common_policy_t<PG, PY>, G, C>(
        "softmax_vjp", y.shape(), request, [&raw](std::size_t i) { return raw[i]; });
}

/// y = log_softmax(x, axis), given y: g - exp(y) * sum_axis(g), in one pass (natural scale sg).
/// shape_error unless g and y have the same shape.
template <class Strategy = default_scaling, class G, class PG, class Y, class PY>
[[nodiscard]] ScaledArray<G, PG> log_softmax_vjp(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y, std::size_t axis)
{
    using C = std::common_type_t<compute_t<G>, compute_t<Y>>;
    detail::require_same_shape("log_softmax_vjp", g, y);
    const detail::axis_lanes lanes("log_softmax_vjp", y.shape(), axis);
    const G* pg = g.data().data();
    const Y* py = y.data().data();
    const C sy = static_cast<C>(y.scale());
    std::vector<C> raw(y.size());
    lanes.for_each([&](std::size_t base, std::size_t stride) {
        C total = 0;
        for (std::size_t k = 0; k < lanes.length; ++k) total += detail::load(pg[base + k * stride]);
        for (std::size_t k = 0; k < lanes.length; ++k) {
            const std::size_t i = base + k * stride;
            const C probability = std::exp(sy == C(0) ? C(0) : detail::load(py[i]) * sy);
            raw[i] = detail::load(pg[i]) - probability * total;
        }
    });
    scale_request request;
    request.natural = g.scale();
    request.input_scales[0] = g.scale();
    request.input_scales[1] = y.scale();
    request.input_count = 2;
    request.axis_length = lanes.length;
    return detail::finish<ops::vjp<ops::log_softmax>, Strategy, PG, G, C>("log_softmax_vjp", y.shape(), request,
                                                                          [&raw](std::size_t i) { return raw[i]; });
}

// ---- layout -----------------------------------------------------------------------------------

/// y = transpose(x): transpose(g). y = reshape(x, ...): g reshaped to x's shape.
template <class G, class P>
[[nodiscard]] ScaledArray<G, P> transpose_vjp(const ScaledArray<G, P>& g)
{
    return transpose(g);
}
template <class G, class P, class Shape>
[[nodiscard]] ScaledArray<G, P> reshape_vjp(const ScaledArray<G, P>& g, const Shape& shape)
{
    return reshape(g, std::vector<std::size_t>(shape.begin(), shape.end()));
}

/// y = concatenate(parts, axis), given each part's extent along `axis`: g cut back into the
/// parts' pieces, each a slice of g (data and scale kept). shape_error unless the extents add up
/// to g's extent along `axis`.
template <class G, class P>
[[nodiscard]] std::vector<ScaledArray<G, P>> concatenate_vjp(const ScaledArray<G, P>& g, const std::vector<std::size_t>& extents,
                                                             std::size_t axis)
{
    std::size_t total = 0;
    for (auto extent : extents) total += extent;
    if (axis >= g.dimension() || total != g.shape()[axis]) {
        SCALIFY_THROW(shape_error(fmt::format("concatenate_vjp: part extents {} along axis {} do not make up the cotangent's shape {}",
                                              shape_string(extents), axis, shape_string(g.shape()))));
    }
    std::vector<ScaledArray<G, P>> parts;
    parts.reserve(extents.size());
    std::size_t first = 0;
    for (auto extent : extents) {
        parts.push_back(slice(g, axis, first, first + extent));
        first += extent;
    }
    return parts;
}

// ---- loss -------------------------------------------------------------------------------------

/// Mean softmax cross-entropy of logits (batch x classes) against integer labels, and its
/// gradient with respect to the logits, (softmax - onehot) / batch, stored under
/// ops::vjp<ops::softmax_cross_entropy>'s rule: natural scale 1 (the data are the gradient, as
/// default_scaling keeps them); unit_scaling gives the expected RMS for unit-normal logits at the
/// logits' scale, about 1 / (batch sqrt(classes)). The loss is computed in double, the gradient
/// in double and stored as float.
template <class T, class P>
struct cross_entropy_result {
    double loss = 0.0;
    ScaledArray<float, P> grad;
};

namespace detail {
/// A sized range of integers (not bool): class labels.
template <class Labels>
concept label_range = std::ranges::sized_range<Labels> && std::integral<std::ranges::range_value_t<Labels>> &&
                      !std::same_as<std::remove_cv_t<std::ranges::range_value_t<Labels>>, bool>;
}  // namespace detail

/// Labels: any sized range of integers (std::vector<std::uint8_t>, std::vector<std::int32_t>,
/// std::span<const std::int64_t>, ...), one per row; class counts up to the size_t range.
/// shape_error for a label count that does not match the batch, or a label outside [0, classes)
/// (the message names the label, its row and the class count).
template <class Strategy = default_scaling, class T, class P, class Labels>
    requires detail::label_range<Labels>
[[nodiscard]] cross_entropy_result<T, P> softmax_cross_entropy(const ScaledArray<T, P>& logits, const Labels& labels)
{
    const auto label_count = static_cast<std::size_t>(std::ranges::size(labels));
    if (logits.dimension() != 2 || logits.shape()[0] != label_count) {
        SCALIFY_THROW(shape_error(fmt::format("softmax_cross_entropy: logits {} and {} labels do not match",
                                              shape_string(logits.shape()), label_count)));
    }
    const std::size_t batch = logits.shape()[0], classes = logits.shape()[1];
    std::vector<std::size_t> target(batch);
    std::size_t row = 0;
    for (const auto label : labels) {
        const auto number = +label;  // promoted: character types print and compare as numbers
        if (std::cmp_less(number, 0) || std::cmp_greater_equal(number, classes)) {
            SCALIFY_THROW(shape_error(fmt::format("softmax_cross_entropy: label {} out of range for {} classes (row {})", number,
                                                  classes, row)));
        }
        target[row++] = static_cast<std::size_t>(number);
    }

    const T* data = logits.data().data();
    const double s = logits.scale();
    const auto value = [&](std::size_t i) { return s == 0.0 ? 0.0 : static_cast<double>(detail::load(data[i])) * s; };
    std::vector<double> top(batch, -std::numeric_limits<double>::infinity()), total(batch, 0.0);
    double loss = 0.0;
    for (std::size_t b = 0; b < batch; ++b) {
        const std::size_t first = b * classes;
        for (std::size_t c = 0; c < classes; ++c) top[b] = std::max(top[b], value(first + c));
        for (std::size_t c = 0; c < classes; ++c) total[b] += std::exp(value(first + c) - top[b]);
        loss += std::log(total[b]) + top[b] - value(first + target[b]);
    }

    scale_request request;
    request.natural = 1.0f;
    request.input_scales[0] = logits.scale();
    request.axis_length = classes;
    request.batch = batch;
    auto grad = detail::finish<ops::vjp<ops::softmax_cross_entropy>, Strategy, P, float, double>(
        "softmax_cross_entropy", std::vector<std::size_t>{batch, classes}, request, [&](std::size_t i) {
            const std::size_t b = i / classes, c = i % classes;
            const double p = std::exp(value(i) - top[b]) / total[b];
            return (p - (c == target[b] ? 1.0 : 0.0)) / static_cast<double>(batch);
        });
    return {batch ? loss / static_cast<double>(batch) : 0.0, std::move(grad)};
}

/// softmax_cross_entropy(logits, {3, 1, 4}): labels as a braced list.
template <class Strategy = default_scaling, class T, class P, std::integral Label>
[[nodiscard]] cross_entropy_result<T, P> softmax_cross_entropy(const ScaledArray<T, P>& logits, std::initializer_list<Label> labels)
{
    return softmax_cross_entropy<Strategy>(logits, std::vector<Label>(labels));
}

}  // namespace scalify
