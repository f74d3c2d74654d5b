#pragma once
/// \file ops.hpp
/// The differentiable primitives: the scaled ops and operators on ad::var, found by ADL, so a
/// model written once as a template runs on plain ScaledArrays (no tape) and on vars (gradients).
/// Each op computes with the scaled primitive of the same name under the var's Strategy and
/// records the op's backward rule (beside the op in ops/*.hpp). Mixed operands: a ScaledArray
/// next to a var is a constant; a double multiplies or divides through the scale (the design's
/// scaled_mul).
///
/// Gradient-path ops change nothing in the forward pass and act on the cotangent only:
/// cast_grad<T> (jax-scalify's cast_ml_dtype_grad), dynamic_rescale_{max,l1,l2}_grad and
/// stop_gradient.

#include <scalify/autodiff/recipe.hpp>
#include <scalify/autodiff/tape.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/linear.hpp>
#include <scalify/ops/matmul.hpp>
#include <scalify/ops/nn.hpp>
#include <scalify/ops/normalization.hpp>
#include <scalify/ops/reduce.hpp>
#include <scalify/ops/sequence.hpp>
#include <scalify/ops/shape.hpp>
#include <scalify/strategy/rescale.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace scalify::ad {

namespace detail {

template <class X>
inline constexpr bool is_scaled_array_v = scalify::is_scaled_array_v<X>;

/// Operands of a differentiable binary op: at least one var, the other a var or a ScaledArray.
template <class X, class Y>
concept var_operands = (is_var_v<X> || is_var_v<Y>) && (is_var_v<X> || is_scaled_array_v<X>) &&
                       (is_var_v<Y> || is_scaled_array_v<Y>);

template <class X, class Y>
using strategy_of_t = typename std::conditional_t<is_var_v<X>, X, Y>::strategy;

/// Operands of a differentiable three-input op (linear, layer_norm with gain and bias): at least
/// one var, each a var or a ScaledArray; the strategy is the first var's.
template <class X, class Y, class Z>
concept var_operands3 = (is_var_v<X> || is_var_v<Y> || is_var_v<Z>) && (is_var_v<X> || is_scaled_array_v<X>) &&
                        (is_var_v<Y> || is_scaled_array_v<Y>) && (is_var_v<Z> || is_scaled_array_v<Z>);
template <class X, class Y, class Z>
using strategy_of3_t = typename std::conditional_t<is_var_v<X>, X, std::conditional_t<is_var_v<Y>, Y, Z>>::strategy;

/// x as a var of Strategy S: itself (moved when it expires), or a constant made from a ScaledArray.
template <class S, class X>
[[nodiscard]] auto lift(X&& x)
{
    using V = std::remove_cvref_t<X>;
    if constexpr (is_var_v<V>) {
        static_assert(std::same_as<typename V::strategy, S>, "ad: operands are vars of different strategies");
        return V(std::forward<X>(x));
    } else {
        return var<typename V::value_type, typename V::scale_policy, S>(std::forward<X>(x));
    }
}

/// f(value of x), the value passed as an rvalue (an expiring ScaledArray whose memory f may
/// reuse) when x's node lets it go (take_expiring), else as a const reference: no copy either way.
template <class T, class P, class S, class F>
[[nodiscard]] decltype(auto) with_value(var<T, P, S>& x, F&& f)
{
    if (std::optional<ScaledArray<T, P>> taken = take_expiring(x)) return f(std::move(*taken));
    return f(x.value());
}

template <class T>
[[nodiscard]] std::vector<std::size_t> shape_vector(const T& shape)
{
    return std::vector<std::size_t>(shape.begin(), shape.end());
}

/// A zero array of g's type and policy (one element, broadcast by where).
template <class G, class P>
[[nodiscard]] ScaledArray<G, P> zero_like(const ScaledArray<G, P>&)
{
    return ScaledArray<G, P>(xt::xarray<G>::from_shape({1}), 0.0f);
}

}  // namespace detail

// ---- binary -----------------------------------------------------------------------------------

namespace detail {
/// add or sub (Op's forward f and backward rule vjp, which read the operands' shapes only): an
/// expiring operand of the result's shape has the result stored over its memory.
template <class S, class A, class B, class Forward, class Vjp>
[[nodiscard]] auto additive(const char* op, A a, B b, Forward forward, Vjp vjp)
{
    auto a_shape = shape_vector(a.shape()), b_shape = shape_vector(b.shape());
    auto output = with_value(a, [&](auto&& av) {
        return with_value(b, [&](auto&& bv) { return forward(std::forward<decltype(av)>(av), std::forward<decltype(bv)>(bv)); });
    });
    return reads_no_output(record_op<S>(op, std::move(output), std::tuple{a, b},
                                        [vjp, a_shape = std::move(a_shape), b_shape = std::move(b_shape)](
                                            auto&& g, const auto&, const auto&, const auto&) {
                                            auto r = vjp(std::forward<decltype(g)>(g), a_shape, b_shape);
                                            return std::tuple{std::move(r.first), std::move(r.second)};
                                        }));
}
}  // namespace detail

/// a + b with broadcasting.
template <class X, class Y>
    requires detail::var_operands<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>
[[nodiscard]] auto add(X&& x, Y&& y)
{
    using S = detail::strategy_of_t<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>;
    return detail::additive<S>(
        "add", detail::lift<S>(std::forward<X>(x)), detail::lift<S>(std::forward<Y>(y)),
        [](auto&& a, auto&& b) { return scalify::add<S>(std::forward<decltype(a)>(a), std::forward<decltype(b)>(b)); },
        [](auto&& g, const auto& a_shape, const auto& b_shape) {
            return scalify::add_vjp<S>(std::forward<decltype(g)>(g), a_shape, b_shape);
        });
}

/// a - b with broadcasting.
template <class X, class Y>
    requires detail::var_operands<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>
[[nodiscard]] auto sub(X&& x, Y&& y)
{
    using S = detail::strategy_of_t<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>;
    return detail::additive<S>(
        "sub", detail::lift<S>(std::forward<X>(x)), detail::lift<S>(std::forward<Y>(y)),
        [](auto&& a, auto&& b) { return scalify::sub<S>(std::forward<decltype(a)>(a), std::forward<decltype(b)>(b)); },
        [](const auto& g, const auto& a_shape, const auto& b_shape) { return scalify::sub_vjp<S>(g, a_shape, b_shape); });
}

namespace detail {
/// Binary ops whose backward rule takes (g, a, b): mul, div, maximum, minimum.
template <class S, class A, class B, class Forward, class Vjp>
[[nodiscard]] auto binary_with_values(const char* op, const A& a, const B& b, Forward forward, Vjp vjp)
{
    return reads_no_output(record_op<S>(op, forward(a.value(), b.value()), std::tuple{a, b},
                                        [vjp](const auto& g, const auto&, const auto& av, const auto& bv) {
                                            auto r = vjp(g, av, bv);
                                            return std::tuple{std::move(r.first), std::move(r.second)};
                                        }));
}
}  // namespace detail

/// a * b with broadcasting.
template <class X, class Y>
    requires detail::var_operands<X, Y>
[[nodiscard]] auto mul(const X& x, const Y& y)
{
    using S = detail::strategy_of_t<X, Y>;
    return detail::binary_with_values<S>(
        "mul", detail::lift<S>(x), detail::lift<S>(y), [](const auto& a, const auto& b) { return scalify::mul<S>(a, b); },
        [](const auto& g, const auto& a, const auto& b) { return scalify::mul_vjp<S>(g, a, b); });
}

/// a / b with broadcasting.
template <class X, class Y>
    requires detail::var_operands<X, Y>
[[nodiscard]] auto div(const X& x, const Y& y)
{
    using S = detail::strategy_of_t<X, Y>;
    return detail::binary_with_values<S>(
        "div", detail::lift<S>(x), detail::lift<S>(y), [](const auto& a, const auto& b) { return scalify::div<S>(a, b); },
        [](const auto& g, const auto& a, const auto& b) { return scalify::div_vjp<S>(g, a, b); });
}

/// Element-wise maximum; the gradient goes to a where a >= b.
template <class X, class Y>
    requires detail::var_operands<X, Y>
[[nodiscard]] auto maximum(const X& x, const Y& y)
{
    using S = detail::strategy_of_t<X, Y>;
    return detail::binary_with_values<S>(
        "maximum", detail::lift<S>(x), detail::lift<S>(y),
        [](const auto& a, const auto& b) { return scalify::maximum<S>(a, b); },
        [](const auto& g, const auto& a, const auto& b) { return scalify::maximum_vjp<S>(g, a, b); });
}

/// Element-wise minimum; the gradient goes to a where a <= b.
template <class X, class Y>
    requires detail::var_operands<X, Y>
[[nodiscard]] auto minimum(const X& x, const Y& y)
{
    using S = detail::strategy_of_t<X, Y>;
    return detail::binary_with_values<S>(
        "minimum", detail::lift<S>(x), detail::lift<S>(y),
        [](const auto& a, const auto& b) { return scalify::minimum<S>(a, b); },
        [](const auto& g, const auto& a, const auto& b) { return scalify::minimum_vjp<S>(g, a, b); });
}

// ---- with a scalar: the factor folds into the scale ---------------------------------------------

// An expiring x (an rvalue var nothing else reads) is scaled in its own memory.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> mul(var<T, P, S> x, double c)
{
    auto output = detail::with_value(x, [c](auto&& v) { return scalify::mul(std::forward<decltype(v)>(v), c); });
    return detail::reads_no_output(detail::record_op<S>("mul", std::move(output), std::tuple{x}, [c](auto&& g, const auto&, const auto&) {
        return std::tuple{scalify::mul(std::forward<decltype(g)>(g), c)};
    }));
}
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> mul(double c, var<T, P, S> x)
{
    return mul(std::move(x), c);
}
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> div(var<T, P, S> x, double c)
{
    auto output = detail::with_value(x, [c](auto&& v) { return scalify::div(std::forward<decltype(v)>(v), c); });
    return detail::reads_no_output(detail::record_op<S>("div", std::move(output), std::tuple{x}, [c](auto&& g, const auto&, const auto&) {
        return std::tuple{scalify::div(std::forward<decltype(g)>(g), c)};
    }));
}

// ---- unary ------------------------------------------------------------------------------------

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> neg(const var<T, P, S>& x)
{
    return detail::record_op<S>("neg", scalify::neg<S>(x.value()), std::tuple{x},
                                [](const auto& g, const auto&, const auto&) { return std::tuple{scalify::neg_vjp(g)}; });
}

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> abs(const var<T, P, S>& x)
{
    return detail::record_op<S>("abs", scalify::abs<S>(x.value()), std::tuple{x},
                                [](const auto& g, const auto&, const auto& xv) { return std::tuple{scalify::abs_vjp<S>(g, xv)}; });
}

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> relu(const var<T, P, S>& x)
{
    return detail::record_op<S>("relu", scalify::relu<S>(x.value()), std::tuple{x},
                                [](const auto& g, const auto&, const auto& xv) { return std::tuple{scalify::relu_vjp<S>(g, xv)}; });
}

/// Differentiated, the forward pass also keeps gelu's derivative at each element (from the same
/// erf), so that the backward pass is one multiplication: gelu_vjp's bits, an exp per element
/// more forward and an erf and an exp fewer backward, and 4 bytes an element held until then.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> gelu(const var<T, P, S>& x)
{
    using C = compute_t<T>;
    if (!x.requires_grad()) return var<T, P, S>(scalify::gelu<S>(x.value()));  // a constant: nothing to record
    xt::xarray<C> derivative = xt::xarray<C>::from_shape({x.size()});  // every element written below
    auto value = scalify::detail::gelu_and_derivative_by_rule<scalify::detail::needs_amax_v<S>>(
        x.value(), scalify::detail::rule_for<ops::gelu, S, P>(), derivative.data());
    return detail::reads_no_output(detail::record_op<S>(
        "gelu", std::move(value), std::tuple{x},
        [derivative = std::move(derivative), x_scale = x.scale()](const auto& g, const auto&, const auto&) {
            return std::tuple{scalify::detail::gelu_vjp_from_derivative<S>(g, x_scale, derivative.data())};
        }));
}

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> exp(const var<T, P, S>& x)
{
    return detail::record_op<S>("exp", scalify::exp<S>(x.value()), std::tuple{x},
                                [](const auto& g, const auto& y, const auto&) { return std::tuple{scalify::exp_vjp<S>(g, y)}; });
}

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> log(const var<T, P, S>& x)
{
    return detail::record_op<S>("log", scalify::log<S>(x.value()), std::tuple{x},
                                [](const auto& g, const auto&, const auto& xv) { return std::tuple{scalify::log_vjp<S>(g, xv)}; });
}

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> sqrt(const var<T, P, S>& x)
{
    return detail::record_op<S>("sqrt", scalify::sqrt<S>(x.value()), std::tuple{x},
                                [](const auto& g, const auto& y, const auto&) { return std::tuple{scalify::sqrt_vjp<S>(g, y)}; });
}

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> tanh(const var<T, P, S>& x)
{
    return detail::record_op<S>("tanh", scalify::tanh<S>(x.value()), std::tuple{x},
                                [](const auto& g, const auto&, const auto& xv) { return std::tuple{scalify::tanh_vjp<S>(g, xv)}; });
}

/// softmax along `axis`.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> softmax(const var<T, P, S>& x, std::size_t axis)
{
    return detail::record_op<S>("softmax", scalify::softmax<S>(x.value(), axis), std::tuple{x},
                                [axis](const auto& g, const auto& y, const auto&) {
                                    return std::tuple{scalify::softmax_vjp<S>(g, y, axis)};
                                });
}

/// log_softmax along `axis`.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> log_softmax(const var<T, P, S>& x, std::size_t axis)
{
    return detail::record_op<S>("log_softmax", scalify::log_softmax<S>(x.value(), axis), std::tuple{x},
                                [axis](const auto& g, const auto& y, const auto&) {
                                    return std::tuple{scalify::log_softmax_vjp<S>(g, y, axis)};
                                });
}

// ---- reductions -------------------------------------------------------------------------------

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> reduce_sum(const var<T, P, S>& x, std::vector<std::size_t> axes)
{
    auto out = scalify::reduce_sum<S>(x.value(), axes);
    return detail::record_op<S>("reduce_sum", std::move(out), std::tuple{x},
                                [axes = std::move(axes)](const auto& g, const auto&, const auto& xv) {
                                    return std::tuple{scalify::reduce_sum_vjp(g, xv.shape(), axes)};
                                });
}
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> reduce_sum(const var<T, P, S>& x)
{
    std::vector<std::size_t> axes(x.dimension());
    for (std::size_t d = 0; d < axes.size(); ++d) axes[d] = d;
    return reduce_sum(x, std::move(axes));
}

/// Mean over `axes`.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> reduce_mean(const var<T, P, S>& x, std::vector<std::size_t> axes)
{
    auto out = scalify::reduce_mean<S>(x.value(), axes);
    return detail::record_op<S>("reduce_mean", std::move(out), std::tuple{x},
                                [axes = std::move(axes)](const auto& g, const auto&, const auto& xv) {
                                    return std::tuple{scalify::reduce_mean_vjp<S>(g, xv.shape(), axes)};
                                });
}
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> reduce_mean(const var<T, P, S>& x)
{
    std::vector<std::size_t> axes(x.dimension());
    for (std::size_t d = 0; d < axes.size(); ++d) axes[d] = d;
    return reduce_mean(x, std::move(axes));
}

namespace detail {

/// Cotangent of reduce_max: g goes to the positions holding the maximum of their slot, split
/// evenly between ties (as PyTorch's amax and JAX's reduce_max do); NaN slots send NaN.
template <class G, class P, class X>
[[nodiscard]] ScaledArray<G, P> reduce_max_vjp(const ScaledArray<G, P>& g, const ScaledArray<X, P>& x,
                                              const ScaledArray<X, P>& y, const std::vector<std::size_t>& axes)
{
    using C = compute_t<X>;
    using CG = compute_t<G>;
    std::vector<std::size_t> kept = shape_vector(x.shape());
    for (auto axis : axes) kept[axis] = 1;
    const std::vector<std::size_t> full = shape_vector(x.shape());
    const xt::xarray<C> xv = x.value();
    const xt::xarray<C> top = xt::broadcast(xt::xarray<C>(scalify::reshape(y, kept).value()), full);
    xt::xarray<float> is_max = xt::xarray<float>::from_shape(full);
    for (std::size_t i = 0; i < xv.size(); ++i) {
        const C t = top.data()[i];
        is_max.data()[i] = (xv.data()[i] == t || t != t) ? 1.0f : 0.0f;
    }
    // Tie counts are small integers: exact under natural scaling at scale 1.
    const auto counts = scalify::reduce_sum<natural_scaling>(ScaledArray<float, P>(is_max, 1.0f), axes);
    const xt::xarray<float> ties = xt::broadcast(xt::xarray<float>(scalify::reshape(counts, kept).data()), full);
    const xt::xarray<G> gv = xt::broadcast(scalify::reshape(g, kept).data(), full);
    xt::xarray<G> data = xt::xarray<G>::from_shape(full);
    for (std::size_t i = 0; i < data.size(); ++i) {
        const CG share = is_max.data()[i] != 0.0f ? scalify::detail::load(gv.data()[i]) / static_cast<CG>(ties.data()[i]) : CG(0);
        data.data()[i] = scalify::detail::store<G>(share);
    }
    return ScaledArray<G, P>(std::move(data), g.scale());
}

}  // namespace detail

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> reduce_max(const var<T, P, S>& x, std::vector<std::size_t> axes)
{
    auto out = scalify::reduce_max<S>(x.value(), axes);
    return detail::record_op<S>("reduce_max", std::move(out), std::tuple{x},
                                [axes = std::move(axes)](const auto& g, const auto& y, const auto& xv) {
                                    return std::tuple{detail::reduce_max_vjp(g, xv, y, axes)};
                                });
}
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> reduce_max(const var<T, P, S>& x)
{
    std::vector<std::size_t> axes(x.dimension());
    for (std::size_t d = 0; d < axes.size(); ++d) axes[d] = d;
    return reduce_max(x, std::move(axes));
}

// ---- selection and layout ---------------------------------------------------------------------

/// cond ? a : b with broadcasting; the cotangent goes to the branch that was chosen.
template <class X, class Y>
    requires detail::var_operands<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>
[[nodiscard]] auto where(const xt::xarray<bool>& cond, X&& x, Y&& y)
{
    using S = detail::strategy_of_t<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>;
    const auto a = detail::lift<S>(x);
    const auto b = detail::lift<S>(y);
    return detail::record_op<S>(
        "where", scalify::where<S>(cond, a.value(), b.value()), std::tuple{a, b},
        [cond](const auto& g, const auto&, const auto& av, const auto& bv) {
            using G = typename std::remove_cvref_t<decltype(g)>::value_type;
            const auto zero = detail::zero_like(g);
            return std::tuple{scalify::detail::unbroadcast<S>(scalify::where<S, G>(cond, g, zero), av.shape()),
                              scalify::detail::unbroadcast<S>(scalify::where<S, G>(cond, zero, g), bv.shape())};
        });
}
// Exact matches for non-const and rvalue masks, so xt::where (found by ADL through the mask)
// does not win overload resolution.
template <class X, class Y>
    requires detail::var_operands<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>
[[nodiscard]] auto where(xt::xarray<bool>& cond, X&& x, Y&& y)
{
    return where(std::as_const(cond), std::forward<X>(x), std::forward<Y>(y));
}
template <class X, class Y>
    requires detail::var_operands<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>
[[nodiscard]] auto where(xt::xarray<bool>&& cond, X&& x, Y&& y)
{
    return where(std::as_const(cond), std::forward<X>(x), std::forward<Y>(y));
}

template <class T, class P, class S>
[[nodiscard]] var<T, P, S> transpose(const var<T, P, S>& x)
{
    return detail::record_op<S>("transpose", scalify::transpose(x.value()), std::tuple{x},
                                [](const auto& g, const auto&, const auto&) { return std::tuple{scalify::transpose_vjp(g)}; });
}

/// Axes permuted: output axis d is input axis perm[d].
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> transpose(const var<T, P, S>& x, std::vector<std::size_t> perm)
{
    auto out = scalify::transpose(x.value(), perm);
    std::vector<std::size_t> inverse(perm.size());
    for (std::size_t d = 0; d < perm.size(); ++d) inverse[perm[d]] = d;
    return detail::reads_no_output(detail::record_op<S>("transpose", std::move(out), std::tuple{x},
                                                        [inverse = std::move(inverse)](const auto& g, const auto&, const auto&) {
                                                            return std::tuple{scalify::transpose(g, inverse)};
                                                        }));
}

/// x with another shape: an expiring x (an rvalue var nothing else reads) gives its memory, no copy.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> reshape(var<T, P, S> x, std::vector<std::size_t> shape)
{
    auto x_shape = detail::shape_vector(x.shape());
    auto output = detail::with_value(x, [&](auto&& v) { return scalify::reshape(std::forward<decltype(v)>(v), std::move(shape)); });
    return detail::reads_no_output(detail::record_op<S>("reshape", std::move(output), std::tuple{x},
                                                        [x_shape = std::move(x_shape)](auto&& g, const auto&, const auto&) {
                                                            return std::tuple{scalify::reshape_vjp(std::forward<decltype(g)>(g), x_shape)};
                                                        }));
}

namespace detail {

/// g placed at [first, last) along `axis` of a zero array of `shape` (slice's backward rule).
template <class G, class P, class Shape>
[[nodiscard]] ScaledArray<G, P> pad_slice(const ScaledArray<G, P>& g, const Shape& shape, std::size_t axis, std::size_t first)
{
    const std::vector<std::size_t> full = shape_vector(shape);
    xt::xarray<G> data = xt::xarray<G>::from_shape(full);
    const G zero = scalify::detail::store<G>(compute_t<G>(0));
    std::size_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= full[d];
    for (std::size_t d = axis + 1; d < full.size(); ++d) inner *= full[d];
    const std::size_t width = g.shape()[axis] * inner, row = full[axis] * inner;
    for (std::size_t o = 0; o < outer; ++o) {  // each element written once: zeros around g's block
        G* out = data.data() + o * row;
        std::fill_n(out, first * inner, zero);
        std::copy_n(g.data().data() + o * width, width, out + first * inner);
        std::fill_n(out + first * inner + width, row - first * inner - width, zero);
    }
    return ScaledArray<G, P>(std::move(data), g.scale());
}

}  // namespace detail

/// [first, last) along `axis`.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> slice(const var<T, P, S>& x, std::size_t axis, std::size_t first, std::size_t last)
{
    return detail::reads_no_output(detail::record_op<S>("slice", scalify::slice(x.value(), axis, first, last), std::tuple{x},
                                                        [axis, first](const auto& g, const auto&, const auto& xv) {
                                                            return std::tuple{detail::pad_slice(g, xv.shape(), axis, first)};
                                                        }));
}

/// x cut along `axis` into parts of `extents` elements (scalify::split; numpy.split, torch.split).
/// Backward: the parts' cotangents joined by concatenate's rule, a part that got none taking
/// zeros, one array for x (PyTorch's split backward is a cat too); slices of x would send x one
/// zero-padded array each and sum them.
template <class T, class P, class S>
[[nodiscard]] std::vector<var<T, P, S>> split(const var<T, P, S>& x, const std::vector<std::size_t>& extents, std::size_t axis = 0)
{
    using C = compute_t<T>;
    auto values = scalify::split(x.value(), extents, axis);
    std::vector<var<T, P, S>> parts;
    parts.reserve(values.size());
    const auto state = detail::var_access::live_tape(x, "split");
    const auto& input = detail::var_access::node(x);
    if (!state || !input->requires_grad) {
        for (auto& v : values) parts.push_back(var<T, P, S>(std::move(v)));
        return parts;
    }
    // The parts' cotangents, kept by each part's backward rule until the first part's (recorded
    // first, so swept last of them) joins them.
    struct gathered {
        std::vector<std::optional<ScaledArray<C, P>>> cotangents;
        std::vector<std::vector<std::size_t>> shapes;
    };
    auto gather = std::make_shared<gathered>();
    gather->cotangents.resize(values.size());
    for (const auto& v : values) gather->shapes.emplace_back(v.shape().begin(), v.shape().end());
    const detail::node_base<P>* const input_base = input.get();
    for (std::size_t i = 0; i < values.size(); ++i) {
        auto node = std::make_shared<detail::value_node<T, P, S>>(std::move(values[i]));
        detail::place_on_tape<P>(*node, *state, "split", std::array{input_base});
        node->backward_reads_output = false;
        if (i != 0) {
            node->backward = [gather, i](gradient<P>&& g) { gather->cotangents[i] = detail::take_as<C>(std::move(g)); };
        } else {
            node->gathers = true;
            node->backward = [gather, input, axis](gradient<P>&& g) {
                if (!g.empty()) gather->cotangents[0] = detail::take_as<C>(std::move(g));
                if (std::none_of(gather->cotangents.begin(), gather->cotangents.end(), [](const auto& c) { return c.has_value(); })) return;
                std::vector<ScaledArray<C, P>> pieces;
                pieces.reserve(gather->cotangents.size());
                for (std::size_t j = 0; j < gather->cotangents.size(); ++j) {
                    auto& c = gather->cotangents[j];
                    // zeros at scale 0: no say in the joined scale
                    if (c) {
                        pieces.push_back(std::move(*c));
                    } else {
                        xt::xarray<C> zeros = xt::xarray<C>::from_shape(gather->shapes[j]);
                        zeros.fill(C(0));
                        pieces.push_back(ScaledArray<C, P>(std::move(zeros), 0.0f));
                    }
                    c.reset();
                }
                input->accumulate(scalify::concatenate<S>(pieces, axis));
            };
        }
        state->nodes.push_back(node);
        parts.push_back(detail::var_access::make(std::move(node), state));
    }
    return parts;
}

/// x cut along `axis` into `sections` parts of equal extent (shape_error unless they divide it).
template <class T, class P, class S>
[[nodiscard]] std::vector<var<T, P, S>> split(const var<T, P, S>& x, std::size_t sections, std::size_t axis = 0)
{
    if (axis >= x.dimension()) {
        SCALIFY_THROW(shape_error(fmt::format("split: axis {} out of range for shape {}", axis, shape_string(x.shape()))));
    }
    return split(x, scalify::detail::equal_sections("split", x.shape()[axis], sections, axis), axis);
}

/// Parts joined along `axis`; each part's cotangent is its slice of the output's.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> concatenate(const std::vector<var<T, P, S>>& parts, std::size_t axis = 0)
{
    std::vector<ScaledArray<T, P>> values;
    values.reserve(parts.size());
    for (const auto& part : parts) values.push_back(part.value());
    auto out = scalify::concatenate<S>(values, axis);
    std::vector<std::size_t> offsets{0};
    for (const auto& part : parts) offsets.push_back(offsets.back() + part.shape()[axis]);
    return detail::record_op_n<S>("concatenate", std::move(out), parts,
                                  [axis, offsets = std::move(offsets)](const auto& g, std::size_t i) {
                                      return scalify::slice(g, axis, offsets[i], offsets[i + 1]);
                                  });
}

// ---- type and scale ---------------------------------------------------------------------------

/// Data converted to U; the cotangent passes through unchanged (the value did not change type
/// for the mathematics; use cast_grad to round gradients).
template <ScaledElement U, RoundingPolicy Rounding = round_nearest_even, SaturationPolicy Saturation = no_saturation,
          class T, class P, class S>
[[nodiscard]] var<U, P, S> cast(const var<T, P, S>& x)
{
    return detail::record_op<S>("cast", scalify::cast<U, Rounding, Saturation>(x.value()), std::tuple{x},
                                [](const auto& g, const auto&, const auto&) { return std::tuple{g}; });
}

/// Same value, data divided and scale multiplied by `factor`; the cotangent passes unchanged.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> rebalance_scale(const var<T, P, S>& x, float factor)
{
    return detail::record_op<S>("rebalance_scale", scalify::rebalance_scale(x.value(), factor), std::tuple{x},
                                [](const auto& g, const auto&, const auto&) { return std::tuple{g}; });
}

// ---- gradient path ----------------------------------------------------------------------------

/// Identity forward; the cotangent is cast to G on its way back (jax-scalify's
/// cast_ml_dtype_grad): E5M2 gradients behind an E4M3 forward.
template <ScaledElement G, RoundingPolicy Rounding = round_nearest_even, SaturationPolicy Saturation = no_saturation,
          class T, class P, class S>
[[nodiscard]] var<T, P, S> cast_grad(const var<T, P, S>& x)
{
    static_assert(GradientElement<G>, "cast_grad: G must be one of the gradient types (see ad::GradientElement)");
    return detail::record_op<S, detail::returns_cotangent_types>("cast_grad", x.value(), std::tuple{x}, [](const auto& g, const auto&, const auto&) {
        return std::tuple{scalify::cast<G, Rounding, Saturation>(g)};
    });
}

/// Identity forward; the cotangent's data max |.| is moved into its scale on the way back.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> dynamic_rescale_max_grad(const var<T, P, S>& x)
{
    return detail::record_op<S>("dynamic_rescale_max_grad", x.value(), std::tuple{x},
                                [](const auto& g, const auto&, const auto&) { return std::tuple{scalify::dynamic_rescale_max(g)}; });
}
/// Identity forward; the cotangent's data mean |.| is moved into its scale on the way back.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> dynamic_rescale_l1_grad(const var<T, P, S>& x)
{
    return detail::record_op<S>("dynamic_rescale_l1_grad", x.value(), std::tuple{x},
                                [](const auto& g, const auto&, const auto&) { return std::tuple{scalify::dynamic_rescale_l1(g)}; });
}
/// Identity forward; the cotangent's data RMS is moved into its scale on the way back.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> dynamic_rescale_l2_grad(const var<T, P, S>& x)
{
    return detail::record_op<S>("dynamic_rescale_l2_grad", x.value(), std::tuple{x},
                                [](const auto& g, const auto&, const auto&) { return std::tuple{scalify::dynamic_rescale_l2(g)}; });
}

/// The same value as a constant: no gradient flows back through it.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> stop_gradient(const var<T, P, S>& x)
{
    return var<T, P, S>(x.value());
}

// ---- matmul -----------------------------------------------------------------------------------

namespace detail {

/// The gradients of a.b for cotangent g (matmul_vjp's products; only those needed), as a tuple;
/// `grids`, a vjp_grids, names the formats whose grids float32 arrays lie on (the recipe's,
/// recipe_matmul); typed_operands, the default, compiles no GEMM over grids.
template <class S, class GradOut, class G, class A, class B, class P, class Grids = scalify::detail::typed_operands>
[[nodiscard]] auto matmul_backward(const ScaledArray<G, P>& g, const ScaledArray<A, P>& av, const ScaledArray<B, P>& bv,
                                   bool need_a, bool need_b, Grids grids = {})
{
    using GA = decltype(scalify::detail::matmul_transposed_b<S, GradOut>(g, bv));
    using GB = decltype(scalify::detail::matmul_transposed_a<S, GradOut>(av, g));
    if (av.dimension() != 2 || bv.dimension() != 2) {
        auto r = scalify::detail::batched_matmul_vjp<S, GradOut>(g, av, bv, need_a, need_b, grids);
        return std::tuple<GA, GB>{std::move(r.first), std::move(r.second)};
    }
    // matmul_vjp's two products, g.b^T then a^T.g, with b and a read transposed in place.
    using scalify::detail::grids_of, scalify::detail::vjp_grids;
    std::tuple<GA, GB> result;
    if (need_a) {
        std::get<0>(result) =
            scalify::detail::matmul_transposed_b<S, GradOut>(g, bv, grids_of(grids, &vjp_grids::g, &vjp_grids::b));
    }
    if (need_b) {
        std::get<1>(result) =
            scalify::detail::matmul_transposed_a<S, GradOut>(av, g, grids_of(grids, &vjp_grids::a, &vjp_grids::g));
    }
    return result;
}

/// Whether matmul's backward products for cotangent G and operands A, B compute exactly what the
/// same products of the values widened to one compute type do: both products (g.b^T, a^T.g)
/// accumulate in that type on Eigen's path (no tensor-core model takes either operand pair)
/// and store the same result type. Then every such (G, A, B) shares one instantiation of the
/// products per compute type: the cotangent types times the operand types (times the recipe's
/// forward types) would otherwise each compile their own.
template <class GradOut, class G, class A, class B>
struct widened_matmul_backward {
    using compute_a = std::common_type_t<compute_t<G>, compute_t<B>>;  // g.b^T
    using compute_b = std::common_type_t<compute_t<A>, compute_t<G>>;  // a^T.g
    using result_a = scalify::detail::out_or_t<GradOut, promote_t<G, B>>;
    using result_b = scalify::detail::out_or_t<GradOut, promote_t<A, G>>;
    template <class X, class Y>
    static constexpr bool exact_pair = std::is_void_v<tensor_core::operand_gemm_t<tensor_core::h100_cublaslt_fp8, X, Y>> &&
                                       std::is_void_v<tensor_core::operand_gemm_t<tensor_core::h100_cublaslt_fp8_fast, X, Y>>;
    static constexpr bool same = std::same_as<G, compute_a> && std::same_as<A, compute_a> && std::same_as<B, compute_a>;
    static constexpr bool value = !same && std::same_as<compute_a, compute_b> && std::same_as<result_a, result_b> &&
                                  exact_pair<G, B> && exact_pair<A, G>;
};

/// x's values in C, at x's scale (exact: C is at least as wide as x's compute type): x itself
/// when it is already in C, else a widened copy held in `storage`. Zeros of x's shape when
/// `needed` is false: no product that is formed reads them.
template <class C, class T, class P>
[[nodiscard]] const ScaledArray<C, P>& widened(const ScaledArray<T, P>& x, bool needed,
                                               std::optional<ScaledArray<C, P>>& storage)
{
    if constexpr (std::same_as<T, C>) {
        return x;
    } else {
        xt::xarray<C> data = xt::xarray<C>::from_shape(x.shape());
        const T* in = x.data().data();
        C* out = data.data();
        if (needed) {
            for (std::size_t i = 0; i < data.size(); ++i) out[i] = static_cast<C>(scalify::detail::load(in[i]));
        } else {
            std::fill_n(out, data.size(), C(0));
        }
        return storage.emplace(std::move(data), x.scale());
    }
}

/// The cotangent types matmul's backward rule takes as they are (sees_narrow_cotangents): those a
/// tensor-core model multiplies by an operand (g.b^T) or an operand by (a^T.g). Every other
/// cotangent is widened first, which widened_matmul_backward shows changes no product.
template <class A, class B>
struct model_cotangents {
    template <class G>
    static constexpr bool keeps = !widened_matmul_backward<void, G, A, B>::template exact_pair<G, B> ||
                                  !widened_matmul_backward<void, G, A, B>::template exact_pair<A, G>;
};

/// a.b recorded with matmul_vjp; only the gradients an input needs are computed (each by the
/// same product matmul_vjp forms). Batched and 1-D operands as numpy's matmul. The gradient
/// products are stored in the operands' promoted type, as matmul_vjp does.
template <class S, class A, class B, class P>
[[nodiscard]] var<promote_t<A, B>, P, S> recorded_matmul(const var<A, P, S>& a, const var<B, P, S>& b)
{
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    using rule = sees_narrow_cotangents<model_cotangents<A, B>>;
    return reads_no_output(record_op<S, rule>("matmul", scalify::matmul<S>(a.value(), b.value()), std::tuple{a, b},
                        [need_a, need_b](const auto& g, const auto&, const auto& av, const auto& bv) {
                            using G = typename std::remove_cvref_t<decltype(g)>::value_type;
                            using widening = widened_matmul_backward<void, G, A, B>;
                            if constexpr (widening::value) {
                                // g.b^T reads g and b, a^T.g reads a and g.
                                using C = typename widening::compute_a;
                                using Out = typename widening::result_a;
                                std::optional<ScaledArray<C, P>> g_c, a_c, b_c;
                                return matmul_backward<S, Out>(widened<C>(g, true, g_c), widened<C>(av, need_b, a_c),
                                                               widened<C>(bv, need_a, b_c), need_a, need_b);
                            } else {
                                return matmul_backward<S, void>(g, av, bv, need_a, need_b);
                            }
                        }));
}

/// x rebalanced and cast to `format` as a matmul_precision_scope says (recipe_cast_array),
/// held as float32 values on format's grid: exact both ways, so the products read the values
/// the cast gives, and a tensor-core model reads them as `format` (operand_grids).
template <class T, class P>
[[nodiscard]] ScaledArray<float, P> recipe_grid(const ScaledArray<T, P>& x, dtype format, cast_scaling scaling)
{
    return scalify::visit_dtype(format, [&]<class F>() -> ScaledArray<float, P> {
        return recipe_grid_array<F>(x, scaling);
    });
}

/// matmul_vjp's products under a matmul_precision_scope: the cotangent cast to the `gradient`
/// format (unless float32), the operands on the `operands` format's grid (recipe_grid's results,
/// or float32 values), the products stored as Out (recipe_matmul).
template <class S, class Out, class G, class A, class B, class P>
[[nodiscard]] auto recipe_backward(const ScaledArray<G, P>& g, const ScaledArray<A, P>& av, const ScaledArray<B, P>& bv,
                                   bool need_a, bool need_b, dtype gradient, cast_scaling scaling, dtype operands)
{
    const scalify::detail::vjp_grids grids{gradient, operands, operands};
    if (gradient == dtype::float32) return matmul_backward<S, Out>(g, av, bv, need_a, need_b, grids);
    return matmul_backward<S, Out>(recipe_grid(g, gradient, scaling), av, bv, need_a, need_b, grids);
}

/// a.b under a matmul_precision_scope, recorded as one op: the operands cast to the forward type
/// (unless it is float32), the product; backward, the cotangent cast to the gradient type (unless
/// float32) and matmul_vjp's products, stored as R, the type the product has without the scope
/// (an fp16 cotangent times an fp16 operand stored in fp16 overflowed to inf where a product
/// outgrew the rule's scale: a softmax's cotangent, g v^T, which the softmax's backward turned
/// into NaN). The casts' results are float32 arrays on the formats' grids, so one body serves
/// every pair of forward and gradient types: the same bits as products of the narrow types.
template <class R, class S, class A, class B, class P>
[[nodiscard]] var<R, P, S> recipe_matmul(const var<A, P, S>& a, const var<B, P, S>& b, matmul_precision precision)
{
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    const cast_scaling scaling = precision.scaling;
    const dtype gradient = precision.gradient;
    // A float32 cotangent's products are float32 anyway: the body recorded_matmul compiles.
    using Out = std::conditional_t<std::same_as<R, float>, void, R>;
    const auto backward_on = [need_a, need_b, scaling, gradient](const auto& g, const auto& av, const auto& bv,
                                                                 dtype operands) {
        return recipe_backward<S, Out>(g, av, bv, need_a, need_b, gradient, scaling, operands);
    };
    if (precision.forward == dtype::float32) {
        return reads_no_output(record_op<S>("matmul", scalify::matmul<S>(a.value(), b.value()), std::tuple{a, b},
                                            [backward_on](const auto& g, const auto&, const auto& av, const auto& bv) {
                                                return backward_on(g, av, bv, dtype::float32);
                                            }));
    }
    const dtype forward = precision.forward;
    ScaledArray<float, P> a_grid = recipe_grid(a.value(), forward, scaling);
    ScaledArray<float, P> b_grid = recipe_grid(b.value(), forward, scaling);
    auto product = scalify::detail::matmul_on_grids<S, Out>(a_grid, b_grid, {forward, forward});
    return reads_no_output(record_op<S>("matmul", std::move(product), std::tuple{a, b},
                                        [backward_on, forward, a_grid = std::move(a_grid), b_grid = std::move(b_grid)](
                                            const auto& g, const auto&, const auto&, const auto&) {
                                            return backward_on(g, a_grid, b_grid, forward);
                                        }));
}

}  // namespace detail

/// a (M x K) times b (K x N), and over leading batch dimensions as numpy's matmul (1-D operands
/// too; see scalify::matmul). Under a matmul_precision_scope the operands are first cast to the
/// scope's forward type and the cotangent reaching the product to its gradient type, each scaled
/// as the scope says (see recipe.hpp); the result and the gradient products keep the type they
/// have without the scope.
template <class X, class Y>
    requires detail::var_operands<X, Y>
[[nodiscard]] auto matmul(const X& x, const Y& y)
{
    using S = detail::strategy_of_t<X, Y>;
    const auto a = detail::lift<S>(x);
    const auto b = detail::lift<S>(y);
    using R = promote_t<typename decltype(a)::value_type, typename decltype(b)::value_type>;
    const matmul_precision precision = current_matmul_precision();
    if (precision.forward != dtype::float32 || precision.gradient != dtype::float32) {
        return detail::recipe_matmul<R>(a, b, precision);
    }
    return detail::recorded_matmul(a, b);
}

/// x.w + b as one op, scalify::linear: the bias enters the GEMM (its rows are the product's
/// initial sum), so no pass over the product adds it; the result's scale is add(matmul(x, w),
/// b)'s and its data round once (docs/ops.md). Under a matmul_precision_scope x and w take the
/// recipe's casts and the cotangent reaching the product its gradient cast, as matmul's do; b's
/// gradient is the cotangent summed over the rows, as add's. Where the bias cannot enter the GEMM
/// (scalify::linear's list) it is matmul(x, w) + b, recorded as those two ops.
template <class X, class W, class Bias>
    requires detail::var_operands3<X, W, Bias>
[[nodiscard]] auto linear(const X& x, const W& w, const Bias& bias)
{
    using S = detail::strategy_of3_t<X, W, Bias>;
    const auto a = detail::lift<S>(x);
    const auto b = detail::lift<S>(w);
    const auto c = detail::lift<S>(bias);
    using T = typename decltype(a)::value_type;
    using P = typename decltype(a)::scale_policy;
    // float32 operands (the recipe's products are float32 ones): other types take the composition.
    constexpr bool all_float = std::same_as<T, float> && std::same_as<typename decltype(b)::value_type, float> &&
                               std::same_as<typename decltype(c)::value_type, float>;
    if constexpr (!all_float || scalify::detail::needs_amax_v<S>) {
        return matmul(a, b) + c;
    } else {
        const matmul_precision precision = current_matmul_precision();
        const bool recipe = precision.forward != dtype::float32 || precision.gradient != dtype::float32;
        const bool cast = precision.forward != dtype::float32;
        const scalify::detail::operand_grids grids{precision.forward, precision.forward};
        const tensor_core::grid_gemm_fn gemm = scalify::detail::current_gemm<float, float>(grids);
        if (!scalify::detail::bias_enters_gemm(a.value(), b.value(), c.value(), gemm)) return matmul(a, b) + c;
        std::optional<ScaledArray<T, P>> a_grid, b_grid;  // the recipe's casts of x and w
        if (cast) {
            a_grid = detail::recipe_grid(a.value(), precision.forward, precision.scaling);
            b_grid = detail::recipe_grid(b.value(), precision.forward, precision.scaling);
        }
        auto value = scalify::detail::linear_in_gemm<false>(
            a_grid ? *a_grid : a.value(), b_grid ? *b_grid : b.value(), c.value(),
            scalify::detail::matmul_rule<S, P>(), scalify::detail::rule_for<ops::add, S, P>(), gemm);
        if (!value) return matmul(a, b) + c;  // a zero scale: the composition's zeros
        const bool need_a = a.requires_grad(), need_b = b.requires_grad(), need_c = c.requires_grad();
        const auto c_shape = detail::shape_vector(c.shape());
        return detail::reads_no_output(detail::record_op<S>(
            "linear", std::move(*value), std::tuple{a, b, c},
            [=, a_grid = std::move(a_grid), b_grid = std::move(b_grid)](const auto& g, const auto&, const auto& av,
                                                                       const auto& bv, const auto&) {
                // add's backward: g passes to the product unchanged, summed over the rows for b.
                auto gc = need_c ? scalify::detail::unbroadcast<S, ops::vjp<ops::add, 1>>(g, c_shape) : ScaledArray<T, P>{};
                auto products = recipe ? detail::recipe_backward<S, void>(g, a_grid ? *a_grid : av, b_grid ? *b_grid : bv,
                                                                          need_a, need_b, precision.gradient, precision.scaling,
                                                                          precision.forward)
                                       : detail::matmul_backward<S, void>(g, av, bv, need_a, need_b);
                return std::tuple{std::move(std::get<0>(products)), std::move(std::get<1>(products)), std::move(gc)};
            }));
    }
}

// ---- normalisation and sequence ops ------------------------------------------------------------

namespace detail {

/// layer_norm (Centred) or rms_norm of x recorded with its backward rule, the lane statistics
/// computed once: the backward rule reads those of the forward pass (the same values) instead of
/// summing x's lanes again.
template <class Op, bool Centred, class T, class P, class S>
[[nodiscard]] var<T, P, S> normalise_recorded(const char* op, const char* vjp_op, const var<T, P, S>& x, double eps)
{
    using statistics = scalify::detail::lane_statistics<Centred, T, P>;
    const auto& xv = x.value();
    auto stats = std::make_shared<const statistics>(xv, scalify::detail::normalised_length(op, xv, eps), eps);
    auto y = scalify::detail::normalise_last_axis<Op, Centred, S, void>(op, xv, eps, *stats);
    return reads_no_output(record_op<S>(op, std::move(y), std::tuple{x},
                                        [eps, vjp_op, stats = std::move(stats)](const auto& g, const auto&, const auto& xv) {
                                            return std::tuple{scalify::detail::normalise_last_axis_vjp<Op, Centred, S, void>(
                                                vjp_op, g, xv, eps, *stats)};
                                        }));
}

}  // namespace detail

/// layer_norm(x) * gain + bias as one recorded op (scalify::layer_norm(x, gain, bias); PyTorch's
/// layer_norm with weight and bias): the forward pass and the three cotangents with the bits and
/// scales of the three ops recorded one by one, in fewer passes and one node. Where
/// scalify::layer_norm(x, gain, bias) runs the composition, so does this (three nodes).
template <class X, class Gain, class Bias>
    requires detail::var_operands3<X, Gain, Bias>
[[nodiscard]] auto layer_norm(const X& x, const Gain& gain, const Bias& bias, double eps = 1e-5)
{
    using S = detail::strategy_of3_t<X, Gain, Bias>;
    const auto a = detail::lift<S>(x);
    const auto g = detail::lift<S>(gain);
    const auto c = detail::lift<S>(bias);
    using T = typename decltype(a)::value_type;
    using P = typename decltype(a)::scale_policy;
    // One float32 or float64 type and a static strategy (plan_affine_norm's): else the composition.
    constexpr bool fusable = std::same_as<typename decltype(g)::value_type, T> && std::same_as<typename decltype(c)::value_type, T> &&
                             std::same_as<typename decltype(g)::scale_policy, P> && std::same_as<typename decltype(c)::scale_policy, P> &&
                             std::same_as<T, compute_t<T>> && !scalify::detail::needs_amax_v<S>;
    if constexpr (!fusable) {
        return layer_norm(a, eps) * g + c;
    } else {
        const auto& xv = a.value();
        const std::size_t length = scalify::detail::normalised_length("layer_norm", xv, eps);
        auto plan = scalify::detail::plan_affine_norm<S>(xv, g.value(), c.value(), length);
        if (!plan) return layer_norm(a, eps) * g + c;
        auto stats = std::make_shared<const scalify::detail::lane_statistics<true, T, P>>(xv, length, eps);
        auto shared_plan = std::make_shared<const scalify::detail::affine_norm_plan<compute_t<T>>>(std::move(*plan));
        auto y = scalify::detail::affine_normalise(xv, g.value(), *stats, *shared_plan);
        return detail::reads_no_output(detail::record_op<S>(
            "layer_norm", std::move(y), std::tuple{a, g, c},
            [eps, stats = std::move(stats), plan = std::move(shared_plan)](const auto& gy, const auto&, const auto& xv, const auto& gv,
                                                                          const auto& bv) {
                auto [dx, dgain, dbias] = scalify::detail::affine_normalise_vjp<S>(gy, xv, gv, bv, eps, *stats, *plan);
                return std::tuple{std::move(dx), std::move(dgain), std::move(dbias)};
            }));
    }
}

/// layer_norm along the last axis (natural scale 1; normalization.hpp); backward layer_norm_vjp.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> layer_norm(const var<T, P, S>& x, double eps = 1e-5)
{
    return detail::normalise_recorded<ops::layer_norm, true>("layer_norm", "layer_norm_vjp", x, eps);
}

/// rms_norm along the last axis (natural scale 1; normalization.hpp); backward rms_norm_vjp.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> rms_norm(const var<T, P, S>& x, double eps = 1e-6)
{
    return detail::normalise_recorded<ops::rms_norm, false>("rms_norm", "rms_norm_vjp", x, eps);
}

/// The rows table[ids] (sequence.hpp); the table's gradient scatter-adds the cotangent's rows.
template <class T, class P, class S, std::integral I>
[[nodiscard]] var<T, P, S> embedding(const var<T, P, S>& table, const xt::xarray<I>& ids)
{
    return detail::reads_no_output(detail::record_op<S>("embedding", scalify::embedding(table.value(), ids), std::tuple{table},
                                [ids, rows = table.shape()[0]](const auto& g, const auto&, const auto&) {
                                    return std::tuple{scalify::embedding_vjp<S>(g, ids, rows)};
                                }));
}

/// Scores with the future masked to -inf (sequence.hpp); the cotangent's masked entries zeroed.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> causal_mask(var<T, P, S> scores)
{
    auto output = detail::with_value(scores, [](auto&& v) { return scalify::causal_mask(std::forward<decltype(v)>(v)); });
    return detail::reads_no_output(detail::record_op<S>("causal_mask", std::move(output), std::tuple{scores},
                                                        [](auto&& g, const auto&, const auto&) {
                                                            return std::tuple{scalify::causal_mask_vjp(std::forward<decltype(g)>(g))};
                                                        }));
}

namespace detail {

/// q k^T over the last two axes, k read transposed in place (no transposed copy of k forward, nor
/// of the cotangent backward): recorded as one "matmul", the bits of matmul(q, transpose(k))'s
/// value and gradients. Under a matmul_precision_scope or an accumulation model, for types other
/// than float32 and for products too small for the GEMM kernel (transposed_reads_keep_bits) it
/// is that composition.
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> matmul_transposed_keys(const var<T, P, S>& q, const var<T, P, S>& k)
{
    std::vector<std::size_t> swap_last(k.dimension());
    for (std::size_t d = 0; d < swap_last.size(); ++d) swap_last[d] = d;
    std::swap(swap_last[swap_last.size() - 2], swap_last[swap_last.size() - 1]);
    if constexpr (!std::same_as<T, float>) {
        return matmul(q, transpose(k, std::move(swap_last)));
    } else {
        if (current_matmul_precision() != full_precision || scalify::detail::current_gemm<float, float>() != nullptr ||
            q.dimension() < 2 || k.dimension() < 2 ||
            !scalify::detail::transposed_reads_keep_bits(q.shape()[q.dimension() - 2], q.shape()[q.dimension() - 1],
                                                         k.shape()[k.dimension() - 2])) {
            return matmul(q, transpose(k, std::move(swap_last)));
        }
        using scalify::detail::batched_product_transposed;
        const auto swapped_last = [](std::vector<std::size_t> shape) {
            std::swap(shape[shape.size() - 2], shape[shape.size() - 1]);
            return shape;
        };
        const auto q_shape = shape_vector(q.shape()), k_shape = shape_vector(k.shape());
        return reads_no_output(record_op<S>(
            "matmul", batched_product_transposed<S, void, false, true>(q.value(), k.value()), std::tuple{q, k},
            [q_shape, kt_shape = swapped_last(k_shape), need_q = q.requires_grad(),
             need_k = k.requires_grad()](const auto& g, const auto&, const auto& qv, const auto& kv) {
                // g (..., Tq, Tk): matmul_vjp's products with the operands in their roles, so the
                // same bits on every GEMM kernel: dq = g.(k^T)^T, read as g.k; dk the transpose of
                // q^T.g (g^T.q swaps the roles, which an ARM64 build's kernel sums in another
                // order); each summed back over the batches its operand was broadcast to.
                ScaledArray<T, P> dq, dk;
                if (need_q) dq = scalify::detail::unbroadcast<S>(batched_product_transposed<S, void, false, false>(g, kv), q_shape);
                if (need_k) {
                    dk = scalify::detail::swap_last_axes(
                        scalify::detail::unbroadcast<S>(batched_product_transposed<S, void, true, false>(qv, g), kt_shape));
                }
                return std::tuple{std::move(dq), std::move(dk)};
            }));
    }
}

}  // namespace detail

/// Scaled dot-product attention as a composition of the differentiable ops:
/// softmax(q k^T / sqrt(d) [causal_mask]) v over the last two axes, q (..., T_q, d),
/// k (..., T_k, d), v (..., T_k, d_v), leading axes batched as matmul's. The 1/sqrt(d) is a
/// factor of the scale (no datum changes); under a matmul_precision_scope both products take
/// the recipe's casts, as every matmul does. (A fused kernel would save at most the 7.5 % of an
/// fp8 training step that attention's element-wise work takes in the char_lm example:
/// docs/benchmarks.md.)
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> attention(const var<T, P, S>& q, const var<T, P, S>& k, const var<T, P, S>& v, bool causal = false)
{
    if (q.dimension() < 2 || k.dimension() < 2 || v.dimension() < 2) {
        SCALIFY_THROW(shape_error(fmt::format("attention: q, k, v must be (..., T, d), got shapes {}, {}, {}",
                                              shape_string(q.shape()), shape_string(k.shape()), shape_string(v.shape()))));
    }
    const double head_size = static_cast<double>(q.shape()[q.dimension() - 1]);
    auto scores = detail::matmul_transposed_keys(q, k) * (1.0 / std::sqrt(head_size));  // scaled in place
    if (causal) scores = causal_mask(std::move(scores));                                           // masked in place
    const std::size_t last = scores.dimension() - 1;
    return matmul(softmax(std::move(scores), last), v);
}

// ---- loss -------------------------------------------------------------------------------------

/// Mean softmax cross-entropy of logits (batch x classes) against integer labels, as a scalar
/// (0-d) var in the logits' compute type (float, or double for double logits); its backward
/// rule is the cross-entropy gradient times the incoming scalar cotangent, which folds into the
/// scale (a loss weight only moves the gradient's scale).
template <class T, class P, class S, class Labels>
[[nodiscard]] var<compute_t<T>, P, S> softmax_cross_entropy(const var<T, P, S>& logits, const Labels& labels)
{
    using L = compute_t<T>;
    auto ce = scalify::softmax_cross_entropy<S>(logits.value(), labels);
    xt::xarray<L> loss = xt::xarray<L>::from_shape({});
    loss() = static_cast<L>(ce.loss);
    return detail::record_op<S>("softmax_cross_entropy", ScaledArray<L, P>(std::move(loss), 1.0f), std::tuple{logits},
                                [grad = std::move(ce.grad)](const auto& g, const auto&, const auto&) {
                                    return std::tuple{scalify::mul(grad, double(g.value().data()[0]))};
                                });
}

// ---- operators --------------------------------------------------------------------------------

template <class X, class Y>
    requires detail::var_operands<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>
[[nodiscard]] auto operator+(X&& x, Y&& y)
{
    return add(std::forward<X>(x), std::forward<Y>(y));
}
template <class X, class Y>
    requires detail::var_operands<std::remove_cvref_t<X>, std::remove_cvref_t<Y>>
[[nodiscard]] auto operator-(X&& x, Y&& y)
{
    return sub(std::forward<X>(x), std::forward<Y>(y));
}
template <class X, class Y>
    requires detail::var_operands<X, Y>
[[nodiscard]] auto operator*(const X& x, const Y& y)
{
    return mul(x, y);
}
template <class X, class Y>
    requires detail::var_operands<X, Y>
[[nodiscard]] auto operator/(const X& x, const Y& y)
{
    return div(x, y);
}
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> operator-(const var<T, P, S>& x)
{
    return neg(x);
}
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> operator*(var<T, P, S> x, double c)
{
    return mul(std::move(x), c);
}
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> operator*(double c, var<T, P, S> x)
{
    return mul(std::move(x), c);
}
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> operator/(var<T, P, S> x, double c)
{
    return div(std::move(x), c);
}

}  // namespace scalify::ad

namespace scalify {

// Gradient-path ops on plain ScaledArrays (no tape, nothing flows back): the identity (a copy), so a
// model that uses them runs unchanged for inference.
template <ScaledElement G, RoundingPolicy Rounding = round_nearest_even, SaturationPolicy Saturation = no_saturation,
          class T, class P>
[[nodiscard]] ScaledArray<T, P> cast_grad(const ScaledArray<T, P>& x)
{
    return x;
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> dynamic_rescale_max_grad(const ScaledArray<T, P>& x)
{
    return x;
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> dynamic_rescale_l1_grad(const ScaledArray<T, P>& x)
{
    return x;
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> dynamic_rescale_l2_grad(const ScaledArray<T, P>& x)
{
    return x;
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> stop_gradient(const ScaledArray<T, P>& x)
{
    return x;
}

/// ad::attention on plain ScaledArrays (inference, no tape), under Strategy's rules.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> attention(const ScaledArray<T, P>& q, const ScaledArray<T, P>& k, const ScaledArray<T, P>& v,
                                          bool causal = false)
{
    using constant = ad::var<T, P, Strategy>;
    return ad::attention(constant(q), constant(k), constant(v), causal).value();
}

}  // namespace scalify
