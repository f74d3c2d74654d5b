#pragma once
/// \file backward.hpp
/// Backward rules (vector-Jacobian products) of the differentiable primitives, as free functions
/// next to the ops: given the gradient g of a scalar loss with respect to an op's output, they
/// return the gradients with respect to its inputs. They are built from the scaled ops, so they
/// propagate scales the same way; the Strategy argument picks the rules. With default_scaling
/// (or unit_scaling) every backward matmul divides by the square root of its own contraction
/// size, as unit scaling's backward rules do (fan-out for the input gradient, batch for the
/// weight gradient).
///
///     auto [ga, gb] = matmul_vjp(g, a, b);   // g.b^T, a^T.g

#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/matmul.hpp>
#include <scalify/ops/nn.hpp>
#include <scalify/ops/reduce.hpp>
#include <scalify/ops/shape.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace scalify {

template <class GA, class GB>
struct vjp_pair {
    GA first;   ///< gradient with respect to the first input
    GB second;  ///< gradient with respect to the second input
};

namespace detail {

/// g summed over the axes that broadcasting added or stretched, so it has `shape`.
template <class Strategy, class T, class P, class Shape>
[[nodiscard]] ScaledArray<T, P> unbroadcast(const ScaledArray<T, P>& g, const Shape& shape)
{
    const std::size_t rank = g.dimension();
    const std::size_t lead = rank - shape.size();
    std::vector<std::size_t> axes;
    for (std::size_t d = 0; d < rank; ++d) {
        if (d < lead || (shape[d - lead] == 1 && g.shape()[d] != 1)) axes.push_back(d);
    }
    if (axes.empty()) return g;
    auto summed = reduce_sum<Strategy, T>(g, axes);
    return reshape(summed, std::vector<std::size_t>(shape.begin(), shape.end()));
}

/// Elementwise map of x's value to a float factor array, as a float ScaledArray of scale 1.
template <class T, class P, class F>
[[nodiscard]] ScaledArray<compute_t<T>, P> value_map(const ScaledArray<T, P>& x, F f)
{
    using C = compute_t<T>;
    const xt::xarray<C> v = x.value();
    xt::xarray<C> out = xt::xarray<C>::from_shape(v.shape());
    for (std::size_t i = 0; i < v.size(); ++i) out.data()[i] = f(v.data()[i]);
    return ScaledArray<compute_t<T>, P>(std::move(out), 1.0f);
}

}  // namespace detail

/// y = a.b: ga = g.b^T, gb = a^T.g.
template <class Strategy = default_scaling, class Out = void, class G, class PG, class A, class PA, class B, class PB>
[[nodiscard]] auto matmul_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    auto ga = matmul<Strategy, Out>(g, transpose(b));
    auto gb = matmul<Strategy, Out>(transpose(a), g);
    return vjp_pair<decltype(ga), decltype(gb)>{std::move(ga), std::move(gb)};
}

/// y = a + b (broadcasting): ga = g, gb = g, each summed back to its operand's shape.
template <class Strategy = default_scaling, class G, class P, class SA, class SB>
[[nodiscard]] auto add_vjp(const ScaledArray<G, P>& g, const SA& a_shape, const SB& b_shape)
{
    return vjp_pair<ScaledArray<G, P>, ScaledArray<G, P>>{detail::unbroadcast<Strategy>(g, a_shape),
                                                          detail::unbroadcast<Strategy>(g, b_shape)};
}

/// y = a - b: ga = g, gb = -g.
template <class Strategy = default_scaling, class G, class P, class SA, class SB>
[[nodiscard]] auto sub_vjp(const ScaledArray<G, P>& g, const SA& a_shape, const SB& b_shape)
{
    return vjp_pair<ScaledArray<G, P>, ScaledArray<G, P>>{detail::unbroadcast<Strategy>(g, a_shape),
                                                          detail::unbroadcast<Strategy>(neg(g), b_shape)};
}

/// y = a * b: ga = g * b, gb = g * a.
template <class Strategy = default_scaling, class Out = void, class G, class PG, class A, class PA, class B, class PB>
[[nodiscard]] auto mul_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    auto ga = detail::unbroadcast<Strategy>(mul<Strategy, Out>(g, b), a.shape());
    auto gb = detail::unbroadcast<Strategy>(mul<Strategy, Out>(g, a), b.shape());
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
    return mul<Strategy, G>(g, detail::value_map(x, [](auto v) { return decltype(v)(v > 0) - decltype(v)(v < 0); }));
}

/// y = relu(x): g where x > 0, else 0. The mask keeps g's scale.
template <class Strategy = default_scaling, class G, class PG, class X, class PX>
[[nodiscard]] auto relu_vjp(const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x)
{
    const xt::xarray<bool> positive = x.value() > 0;
    const auto zero = ScaledArray<G, PG>(xt::xarray<G>::from_shape({1}), 0.0f);
    return where<Strategy, G>(positive, g, zero);
}

/// y = gelu(x) (erf form): g * (Phi(x) + x phi(x)).
template <class Strategy = default_scaling, class G, class PG, class X, class PX>
[[nodiscard]] auto gelu_vjp(const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x)
{
    return mul<Strategy, G>(g, detail::value_map(x, [](auto v) {
                                using C = decltype(v);
                                const C cdf = C(0.5) * (C(1) + std::erf(v * C(0.70710678118654752440)));
                                const C pdf = std::exp(C(-0.5) * v * v) * C(0.39894228040143267794);
                                return cdf + v * pdf;
                            }));
}

/// y = exp(x), given y: g * y.
template <class Strategy = default_scaling, class G, class PG, class Y, class PY>
[[nodiscard]] auto exp_vjp(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y)
{
    return mul<Strategy, G>(g, y);
}

/// y = log(x): g / x.
template <class Strategy = default_scaling, class G, class PG, class X, class PX>
[[nodiscard]] auto log_vjp(const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x)
{
    return div<Strategy, G>(g, x);
}

/// y = sqrt(x), given y: g / (2 y).
template <class Strategy = default_scaling, class G, class PG, class Y, class PY>
[[nodiscard]] auto sqrt_vjp(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y)
{
    return div<Strategy, G>(g, mul(y, 2.0));
}

/// y = reduce_sum(x, axes): g broadcast back over the summed axes of `shape`.
template <class G, class P, class Shape>
[[nodiscard]] ScaledArray<G, P> reduce_sum_vjp(const ScaledArray<G, P>& g, const Shape& shape, std::vector<std::size_t> axes)
{
    std::vector<std::size_t> kept(shape.begin(), shape.end());
    for (auto axis : axes) kept[axis] = 1;
    const auto reshaped = reshape(g, kept);
    return ScaledArray<G, P>(xt::xarray<G>(xt::broadcast(reshaped.data(), std::vector<std::size_t>(shape.begin(), shape.end()))),
                             g.scale());
}

/// y = softmax(x, axis), given y: y * (g - sum(g * y, axis)).
template <class Strategy = default_scaling, class G, class PG, class Y, class PY>
[[nodiscard]] auto softmax_vjp(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y, std::size_t axis)
{
    using C = std::common_type_t<compute_t<G>, compute_t<Y>>;
    const auto gy = mul<Strategy, C>(g, y);
    const auto dot = reduce_sum_vjp(reduce_sum<Strategy, C>(gy, {axis}), gy.shape(), {axis});
    return mul<Strategy, G>(y, sub<Strategy, C>(g, dot));
}

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

/// Mean softmax cross-entropy of logits (batch x classes) against integer labels, and its
/// gradient with respect to the logits, (softmax - onehot) / batch, as a float array of scale 1.
/// Computed in double for the loss, float for the gradient. shape_error for a label count that
/// does not match the batch; labels outside [0, classes) are shape_errors too.
template <class T, class P>
struct cross_entropy_result {
    double loss = 0.0;
    ScaledArray<float, P> grad;
};

template <class T, class P>
[[nodiscard]] cross_entropy_result<T, P> softmax_cross_entropy(const ScaledArray<T, P>& logits, const std::vector<std::uint8_t>& labels)
{
    if (logits.dimension() != 2 || logits.shape()[0] != labels.size()) {
        SCALIFY_THROW(shape_error(fmt::format("softmax_cross_entropy: logits {} and {} labels do not match",
                                              shape_string(logits.shape()), labels.size())));
    }
    const std::size_t batch = logits.shape()[0], classes = logits.shape()[1];
    const auto v = logits.value();  // compute_t<T>: double logits stay double
    xt::xarray<float> grad = xt::xarray<float>::from_shape({batch, classes});
    double total = 0.0;
    for (std::size_t b = 0; b < batch; ++b) {
        if (labels[b] >= classes) {
            SCALIFY_THROW(shape_error(fmt::format("softmax_cross_entropy: label {} out of range for {} classes", labels[b], classes)));
        }
        double top = -std::numeric_limits<double>::infinity();
        for (std::size_t c = 0; c < classes; ++c) top = std::max(top, double(v(b, c)));
        double sum = 0.0;
        for (std::size_t c = 0; c < classes; ++c) sum += std::exp(double(v(b, c)) - top);
        total += std::log(sum) + top - double(v(b, labels[b]));
        for (std::size_t c = 0; c < classes; ++c) {
            const double p = std::exp(double(v(b, c)) - top) / sum;
            grad(b, c) = static_cast<float>((p - (c == labels[b] ? 1.0 : 0.0)) / double(batch));
        }
    }
    return {batch ? total / double(batch) : 0.0, ScaledArray<float, P>(std::move(grad), 1.0f)};
}

}  // namespace scalify
