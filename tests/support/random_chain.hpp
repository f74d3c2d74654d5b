#pragma once
// A random chain of differentiable ops, for the autodiff tests and fuzz target:
//   h = matmul(a, b); then steps from `ops` (each may use the side parameters c (M x N) and
//   bias (N)); result = reduce_sum(h).
// It runs as a template over the array type (plain ScaledArray or ad::var), and `hand_gradients`
// composes the backward rules by hand, in the order the tape's reverse sweep uses, so the two
// can be compared bit for bit.
#include <scalify/scalify.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

namespace scalify::testing {

enum class chain_op : std::uint8_t {
    relu, gelu, neg, abs, mul_c, add_bias, maximum_c, softmax, scale_3, exp_small, transpose2,
    // The transformer's ops: tanh; layer_norm and rms_norm along the rows; softmax of causally
    // masked rows (a plain softmax for types without an infinity); the rows gathered by fixed ids
    // (embedding, h as its table); h plus each row's dot product with c's row (a batched matmul
    // of M (1 x N) by (N x 1) products, broadcast back).
    tanh, layer_norm, rms_norm, masked_softmax, gather_rows, row_dot,
    // h's first column moved last: a split into (1, N - 1) columns joined the other way round.
    // layer_norm with a gain and a bias (both the bias row: one op, the composition's bits).
    split_rotate, layer_norm_affine,
    count
};

/// The ids gather_rows reads: row i takes row (7 i + 3) mod M (repeats and gaps for most M).
inline xt::xarray<int> gather_ids(std::size_t rows)
{
    xt::xarray<int> ids = xt::xarray<int>::from_shape({rows});
    for (std::size_t i = 0; i < rows; ++i) ids(i) = static_cast<int>((7 * i + 3) % rows);
    return ids;
}

template <class H>
inline constexpr bool maskable_v = std::numeric_limits<typename H::value_type>::has_infinity;

inline constexpr std::size_t chain_op_count = static_cast<std::size_t>(chain_op::count);

struct chain {
    std::vector<chain_op> ops;

    /// reduce_sum of the chain; works for ScaledArrays and vars (found by ADL).
    template <class A, class C, class Bias>
    auto operator()(const A& a, const A& b, const C& c, const Bias& bias) const
    {
        auto h = matmul(a, b);
        for (const auto op : ops) h = step(op, h, c, bias);
        return reduce_sum(h);
    }

    template <class H, class C, class Bias>
    static H step(chain_op op, const H& h, const C& c, const Bias& bias)
    {
        switch (op) {
        case chain_op::relu: return relu(h);
        case chain_op::gelu: return gelu(h);
        case chain_op::neg: return neg(h);
        case chain_op::abs: return abs(h);
        case chain_op::mul_c: return h * c;
        case chain_op::add_bias: return h + bias;
        case chain_op::maximum_c: return maximum(h, c);
        case chain_op::softmax: return softmax(h, 1);
        case chain_op::scale_3: return h * 3.0;
        case chain_op::exp_small: return exp(h * 0.0625);
        case chain_op::transpose2: return transpose(transpose(h));
        case chain_op::tanh: return tanh(h);
        case chain_op::layer_norm: return layer_norm(h);
        case chain_op::rms_norm: return rms_norm(h);
        case chain_op::masked_softmax:
            if constexpr (maskable_v<H>) return softmax(causal_mask(h), 1);
            else return softmax(h, 1);
        case chain_op::gather_rows: return embedding(h, gather_ids(h.shape()[0]));
        case chain_op::row_dot: {
            // Two statements: the row's node is recorded before the column's whatever the
            // compiler's argument order (the cotangents' sum order follows the nodes).
            const std::size_t m = h.shape()[0], n = h.shape()[1];
            const auto row = reshape(h, {m, 1, n});
            const auto column = reshape(c, {m, n, 1});
            return h + reshape(matmul(row, column), {m, 1});
        }
        case chain_op::split_rotate: {
            auto parts = split(h, std::vector<std::size_t>{1, h.shape()[1] - 1}, 1);
            return concatenate(std::vector<H>{parts[1], parts[0]}, 1);
        }
        case chain_op::layer_norm_affine: return layer_norm(h, bias, bias);
        case chain_op::count: break;
        }
        return h;
    }
};

/// Running sum of cotangents as the tape keeps it: same types add under Strategy; different
/// types are widened to float (double if either is double) first.
template <class Strategy, class P>
void accumulate(ad::gradient<P>& sum, const auto& g)
{
    if (sum.empty()) {
        sum = g;
        return;
    }
    sum = sum.visit([&](const auto& held) -> ad::gradient<P> {
        using H = typename std::remove_cvref_t<decltype(held)>::value_type;
        using G = typename std::remove_cvref_t<decltype(g)>::value_type;
        if constexpr (std::same_as<H, G>) return add<Strategy>(held, g);
        else {
            using C = std::conditional_t<std::same_as<H, double> || std::same_as<G, double>, double, float>;
            return add<Strategy>(cast<C>(held), cast<C>(g));
        }
    });
}

template <class P>
struct chain_gradients {
    ad::gradient<P> a, b, c, bias;
};

/// The chain's gradients from the ops' backward rules (ops/*.hpp), composed by hand.
template <class Strategy, class T, class P>
chain_gradients<P> hand_gradients(const chain& program, const ScaledArray<T, P>& a, const ScaledArray<T, P>& b,
                                  const ScaledArray<T, P>& c, const ScaledArray<T, P>& bias)
{
    using C = compute_t<T>;
    // Forward, keeping what the backward rules read.
    std::vector<ScaledArray<T, P>> inputs, outputs, pre_exp;
    auto h = matmul<Strategy>(a, b);
    for (const auto op : program.ops) {
        inputs.push_back(h);
        if (op == chain_op::exp_small) pre_exp.push_back(mul(h, 0.0625));
        else pre_exp.push_back(h);
        switch (op) {
        case chain_op::relu: h = relu<Strategy>(h); break;
        case chain_op::gelu: h = gelu<Strategy>(h); break;
        case chain_op::neg: h = neg<Strategy>(h); break;
        case chain_op::abs: h = abs<Strategy>(h); break;
        case chain_op::mul_c: h = mul<Strategy>(h, c); break;
        case chain_op::add_bias: h = add<Strategy>(h, bias); break;
        case chain_op::maximum_c: h = maximum<Strategy>(h, c); break;
        case chain_op::softmax: h = softmax<Strategy>(h, 1); break;
        case chain_op::scale_3: h = mul(h, 3.0); break;
        case chain_op::exp_small: h = exp<Strategy>(pre_exp.back()); break;
        case chain_op::transpose2: h = transpose(transpose(h)); break;
        case chain_op::tanh: h = tanh<Strategy>(h); break;
        case chain_op::layer_norm: h = layer_norm<Strategy>(h); break;
        case chain_op::rms_norm: h = rms_norm<Strategy>(h); break;
        case chain_op::masked_softmax:
            if constexpr (maskable_v<ScaledArray<T, P>>) h = softmax<Strategy>(causal_mask(h), 1);
            else h = softmax<Strategy>(h, 1);
            break;
        case chain_op::gather_rows: h = embedding(h, gather_ids(h.shape()[0])); break;
        case chain_op::row_dot: {
            const std::size_t m = h.shape()[0], n = h.shape()[1];
            h = add<Strategy>(h, reshape(matmul<Strategy>(reshape(h, {m, 1, n}), reshape(c, {m, n, 1})), {m, 1}));
            break;
        }
        case chain_op::split_rotate: {
            const auto parts = split(h, std::vector<std::size_t>{1, h.shape()[1] - 1}, 1);
            h = concatenate<Strategy>({parts[1], parts[0]}, 1);
            break;
        }
        case chain_op::layer_norm_affine: h = add<Strategy>(mul<Strategy>(layer_norm<Strategy>(h), bias), bias); break;
        case chain_op::count: break;
        }
        outputs.push_back(h);
    }
    // Backward: seed 1 at the scalar sum, then the steps in reverse.
    xt::xarray<C> one = xt::xarray<C>::from_shape({});
    one() = C(1);
    const auto total = reduce_sum<Strategy>(h);
    ad::gradient<P> g = reduce_sum_vjp(ScaledArray<C, P>(one, 1.0f), h.shape(), std::vector<std::size_t>{0, 1});
    (void)total;
    chain_gradients<P> out;
    for (std::size_t k = program.ops.size(); k-- > 0;) {
        const auto& x = inputs[k];
        const auto& y = outputs[k];
        g = g.visit([&](const auto& gk) -> ad::gradient<P> {
            switch (program.ops[k]) {
            case chain_op::relu: return relu_vjp<Strategy>(gk, x);
            case chain_op::gelu: return gelu_vjp<Strategy>(gk, x);
            case chain_op::neg: return neg_vjp(gk);
            case chain_op::abs: return abs_vjp<Strategy>(gk, x);
            case chain_op::mul_c: {
                auto r = mul_vjp<Strategy>(gk, x, c);
                accumulate<Strategy>(out.c, r.second);
                return r.first;
            }
            case chain_op::add_bias: {
                auto r = add_vjp<Strategy>(gk, x.shape(), bias.shape());
                accumulate<Strategy>(out.bias, r.second);
                return r.first;
            }
            case chain_op::maximum_c: {
                auto r = maximum_vjp<Strategy>(gk, x, c);
                accumulate<Strategy>(out.c, r.second);
                return r.first;
            }
            case chain_op::softmax: return softmax_vjp<Strategy>(gk, y, 1);
            case chain_op::scale_3: return mul(gk, 3.0);
            case chain_op::exp_small: return mul(exp_vjp<Strategy>(gk, y), 0.0625);
            case chain_op::transpose2: return transpose_vjp(transpose_vjp(gk));
            case chain_op::tanh: return tanh_vjp<Strategy>(gk, x);
            case chain_op::layer_norm: return layer_norm_vjp<Strategy>(gk, x);
            case chain_op::rms_norm: return rms_norm_vjp<Strategy>(gk, x);
            case chain_op::masked_softmax:
                if constexpr (maskable_v<ScaledArray<T, P>>) return causal_mask_vjp(softmax_vjp<Strategy>(gk, y, 1));
                else return softmax_vjp<Strategy>(gk, y, 1);
            case chain_op::gather_rows: return embedding_vjp<Strategy>(gk, gather_ids(x.shape()[0]), x.shape()[0]);
            case chain_op::row_dot: {
                // The tape's order: the add's cotangent reaches x first; then (the later node
                // first) c's column and x's row, each through its reshape.
                const std::size_t m = x.shape()[0], n = x.shape()[1];
                const auto row = reshape(x, {m, 1, n}), column = reshape(c, {m, n, 1});
                const auto dots = reshape(matmul<Strategy>(row, column), {m, 1});
                auto r = add_vjp<Strategy>(gk, x.shape(), dots.shape());
                ad::gradient<P> sum;
                accumulate<Strategy>(sum, r.first);
                auto products = matmul_vjp<Strategy>(reshape(r.second, {m, 1, 1}), row, column);
                accumulate<Strategy>(out.c, reshape(products.second, {m, n}));
                accumulate<Strategy>(sum, reshape(products.first, {m, n}));
                return sum;
            }
            case chain_op::split_rotate: {
                // concatenate's rule cuts the cotangent back; split's joins the pieces in x's order.
                const std::size_t n = x.shape()[1];
                auto pieces = concatenate_vjp(scalify::cast<C>(gk), {n - 1, 1}, 1);
                return concatenate<Strategy>({pieces[1], pieces[0]}, 1);
            }
            case chain_op::layer_norm_affine: {
                // The fused op sends the gain's cotangent before the bias's (its inputs' order),
                // the composition the bias's first (the add is the later node).
                const auto normalised = layer_norm<Strategy>(x);
                const auto product = mul<Strategy>(normalised, bias);
                auto sum = add_vjp<Strategy>(gk, product.shape(), bias.shape());
                auto factors = mul_vjp<Strategy>(sum.first, normalised, bias);
                const bool fused = std::same_as<T, C> && scalify::detail::plan_affine_norm<Strategy>(x, bias, bias, x.shape()[1]).has_value();
                if (!fused) accumulate<Strategy>(out.bias, sum.second);
                accumulate<Strategy>(out.bias, factors.second);
                if (fused) accumulate<Strategy>(out.bias, sum.second);
                return layer_norm_vjp<Strategy>(factors.first, x);
            }
            case chain_op::count: break;
            }
            return gk;
        });
    }
    g.visit([&](const auto& gm) {
        auto r = matmul_vjp<Strategy>(gm, a, b);
        accumulate<Strategy>(out.a, r.first);
        accumulate<Strategy>(out.b, r.second);
    });
    return out;
}

/// Bit-for-bit equality of two gradients: same type, scale and data bits, a NaN matching any
/// NaN (IEEE leaves the sign and payload of an operation's NaN open: two GEMM kernels that
/// add the same terms in another operand order give -nan and +nan).
template <class P>
bool same_bits(const ad::gradient<P>& x, const ad::gradient<P>& y)
{
    if (x.empty() || y.empty()) return x.empty() == y.empty();
    if (x.variant().index() != y.variant().index() || x.scale() != y.scale()) return false;
    return x.visit([&](const auto& xa) {
        using A = std::remove_cvref_t<decltype(xa)>;
        using T = typename A::value_type;
        const auto& ya = std::get<A>(y.variant());
        if (xa.shape() != ya.shape()) return false;
        for (std::size_t i = 0; i < xa.size(); ++i) {
            const T& u = xa.data().data()[i];
            const T& v = ya.data().data()[i];
            if (std::memcmp(&u, &v, sizeof(T)) == 0) continue;
            if (!(std::isnan(static_cast<double>(scalify::detail::load(u))) && std::isnan(static_cast<double>(scalify::detail::load(v))))) {
                return false;
            }
        }
        return true;
    });
}

}  // namespace scalify::testing
