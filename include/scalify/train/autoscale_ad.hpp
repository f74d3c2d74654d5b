#pragma once
/// \file autoscale_ad.hpp
/// AutoScale inside autodiff graphs (scalify::ad). A scaled Linear records itself as one custom op
/// whose forward and backward products are separate AutoScale ops, each with its own propagation
/// scale:
///
///     <name>.x       cast of the input to F            y      = x8 @ w8    (scale x8.scale * w8.scale * prop_y)
///     <name>.w       cast of the weight to F           grad_x = g8 @ w8^T  (scale g8.scale * w8.scale * prop_grad_x)
///     <name>.y       forward product                   grad_w = x8^T @ g8  (scale x8.scale * g8.scale * prop_grad_w)
///     <name>.g       cast of the cotangent to G
///     <name>.grad_x  input gradient, stored in X
///     <name>.grad_w  weight gradient, stored in W
///
/// Because every multiplier sits on top of the scales its inputs carry, a drop of one gradient's
/// scale (a loss weight that folds into the scale) moves no multiplier at all, and a drop that
/// enters the data of one op's result moves that op's multiplier only: the ops downstream see it
/// in their input scales (the design's point 7, unlike TransformerEngine where every backward
/// tensor's amax moves).
///
/// While an op analyses, its operands are float32 inside the op; the op's result is stored in its
/// declared type (Y for y, G for the gradients), because an ad::var's element type is fixed at
/// compile time. After analysis, everything runs in F / G with the held multipliers.
///
///     autoscale::scaling_context<pow2_scale> ctx({}, autoscale::on_off(1.0 / 3, 1.0 / 20));
///     autoscale::graph_linear<float8_e4m3fn, float8_e5m2, float, float, float> fc1(ctx, "fc1");
///     auto [loss, grads] = ad::value_and_grad([&](const auto& p) {
///         return ad::softmax_cross_entropy(fc1(x, p.w1) + p.b1, labels);
///     }, params);

#include <scalify/autodiff.hpp>
#include <scalify/ops/matmul.hpp>
#include <scalify/ops/shape.hpp>
#include <scalify/train/autoscale.hpp>

#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <variant>

namespace scalify::autoscale {

namespace detail {

/// What a cast op of this context returns (float32 while analysing, F after) as float32 values
/// on its format's grid, and that format: the products then compile one body for every format,
/// with the bits of the typed operands (scalify::detail::operand_grids).
/// Decoded once per step and kept for the backward products, as the precision scope's operands
/// are (4 bytes per element).
template <ScalePolicy P>
struct grid_operand {
    ScaledArray<float, P> values;
    dtype format = dtype::float32;
};

template <ScaledElement F, ScalePolicy P>
[[nodiscard]] grid_operand<P> grid_operand_of(const any_scaled_array<P>& a)
{
    if (const auto* wide = std::get_if<ScaledArray<float, P>>(&a.variant())) return {*wide, dtype::float32};
    return {scalify::cast<float>(std::get<ScaledArray<F, P>>(a.variant())), dtype_of<F>};
}

/// a.b of two grid operands, and the products of matmul_vjp with one stored transposed.
template <class St, ScalePolicy P>
[[nodiscard]] ScaledArray<float, P> grid_matmul(const grid_operand<P>& a, const grid_operand<P>& b)
{
    return scalify::detail::matmul_on_grids<St, void>(a.values, b.values, {a.format, b.format});
}
template <class St, ScalePolicy P>
[[nodiscard]] ScaledArray<float, P> grid_matmul_transposed_b(const grid_operand<P>& a, const grid_operand<P>& b)
{
    return scalify::detail::matmul_transposed_b<St, void>(a.values, b.values,
                                                          scalify::detail::operand_grids{a.format, b.format});
}
template <class St, ScalePolicy P>
[[nodiscard]] ScaledArray<float, P> grid_matmul_transposed_a(const grid_operand<P>& a, const grid_operand<P>& b)
{
    return scalify::detail::matmul_transposed_a<St, void>(a.values, b.values,
                                                          scalify::detail::operand_grids{a.format, b.format});
}

template <class X>
inline constexpr bool is_var_v = false;
template <class T, class P, class S>
inline constexpr bool is_var_v<ad::var<T, P, S>> = true;

template <class X>
struct var_strategy {
    using type = void;
};
template <class T, class P, class S>
struct var_strategy<ad::var<T, P, S>> {
    using type = S;
};

/// x as a var of strategy S: itself, or a constant made from a ScaledArray.
template <class S, class X>
[[nodiscard]] auto as_var(const X& x)
{
    if constexpr (is_var_v<X>) return x;
    else return ad::var<typename X::value_type, typename X::scale_policy, S>(x);
}

}  // namespace detail

/// A scaled Linear for autodiff graphs: y = x @ w with the six ops above. F: the forward operands'
/// type; G: the cotangent operand's type; Y: y's type (F by default; float keeps the product in
/// float32, as fp8 recipes usually do); W: grad_w's type (G by default; float for float32 master
/// weights); X: grad_x's type (G by default; float keeps the element-wise backward ops between two
/// layers, an activation's and a bias's, in float32, and the next layer's .g op casts to G, as Y =
/// float does forward). The layer holds no weight: it is a parameter of the graph.
template <ScaledElement F = float8_e4m3fn, ScaledElement G = float8_e5m2, ScaledElement Y = F, ScaledElement W = G,
          ScaledElement X = G, ScalePolicy P = pow2_scale>
class graph_linear {
    static_assert(RuntimeDtype<F> && RuntimeDtype<G>,
                  "graph_linear: F and G must be float, Eigen::half, Eigen::bfloat16 or an fp8 type");
    static_assert(ad::GradientElement<Y> && ad::GradientElement<W> && ad::GradientElement<X>,
                  "graph_linear: Y, W and X must be gradient element types");

public:
    using policy = P;

    graph_linear(scaling_context<P>& context, std::string_view name)
        : m_context(&context), m_x(context.op(std::string(name) + ".x")), m_w(context.op(std::string(name) + ".w")),
          m_y(context.op(std::string(name) + ".y")), m_g(context.op(std::string(name) + ".g")),
          m_grad_x(context.op(std::string(name) + ".grad_x")), m_grad_w(context.op(std::string(name) + ".grad_w"))
    {
    }

    /// x (batch, in) @ w (in, out) recorded on x's / w's tape. shape_error unless both are 2-D and
    /// their inner dimensions agree. A gradient (and its op) is computed only for an input that needs it.
    template <ScaledElement T, ScaledElement U, class S>
    [[nodiscard]] ad::var<Y, P, S> operator()(const ad::var<T, P, S>& x, const ad::var<U, P, S>& w)
    {
        check_shapes(x.value(), w.value());
        scaling_context<P>& ctx = *m_context;
        auto x8 = detail::grid_operand_of<F>(ctx.scale(m_x, x.value(), dtype_of<F>));
        auto w8 = detail::grid_operand_of<F>(ctx.scale(m_w, w.value(), dtype_of<F>));
        ScaledArray<Y, P> y =
            ctx.template apply<Y>(m_y, [&]<class St>(strategy_tag<St>) { return detail::grid_matmul<St>(x8, w8); });
        const bool need_x = x.requires_grad(), need_w = w.requires_grad();
        if (!need_x && !need_w) return ad::var<Y, P, S>(std::move(y));
        return ad::custom_op<S>(std::move(y), std::tuple{x, w},
                                [&ctx, ops = *this, need_x, need_w, x8 = std::move(x8), w8 = std::move(w8)](const auto& g) {
                                    return ops.backward(ctx, g, x8, w8, need_x, need_w);
                                });
    }

    /// A ScaledArray operand next to a var is a constant (no gradient flows into it).
    template <class In, class Weight>
        requires(detail::is_var_v<In> != detail::is_var_v<Weight>) && (detail::is_var_v<In> || AnyScaledArray<In>) &&
                (detail::is_var_v<Weight> || AnyScaledArray<Weight>)
    [[nodiscard]] auto operator()(const In& x, const Weight& w)
    {
        using S = std::conditional_t<detail::is_var_v<In>, typename detail::var_strategy<In>::type,
                                     typename detail::var_strategy<Weight>::type>;
        return (*this)(detail::as_var<S>(x), detail::as_var<S>(w));
    }

    /// Without a tape (inference): the forward ops only.
    template <ScaledElement T, ScaledElement U>
    [[nodiscard]] ScaledArray<Y, P> operator()(const ScaledArray<T, P>& x, const ScaledArray<U, P>& w)
    {
        return (*this)(ad::var<T, P>(x), ad::var<U, P>(w)).value();
    }

    [[nodiscard]] float prop_scale() const { return m_context->record(m_y).prop_scale; }
    [[nodiscard]] float grad_x_prop_scale() const { return m_context->record(m_grad_x).prop_scale; }
    [[nodiscard]] float grad_w_prop_scale() const { return m_context->record(m_grad_w).prop_scale; }
    [[nodiscard]] op_handle input_op() const noexcept { return m_x; }
    [[nodiscard]] op_handle weight_op() const noexcept { return m_w; }
    [[nodiscard]] op_handle output_op() const noexcept { return m_y; }
    [[nodiscard]] op_handle cotangent_op() const noexcept { return m_g; }
    [[nodiscard]] op_handle grad_x_op() const noexcept { return m_grad_x; }
    [[nodiscard]] op_handle grad_w_op() const noexcept { return m_grad_w; }

private:
    /// The backward products: the cotangent cast to G (op .g, skipped when it already is G), then
    /// grad_x = g @ w8^T (op .grad_x, stored in X) and grad_w = x8^T @ g (op .grad_w, stored in W).
    template <class Gin>
    [[nodiscard]] std::tuple<ScaledArray<X, P>, ScaledArray<W, P>> backward(scaling_context<P>& ctx,
                                                                            const ScaledArray<Gin, P>& g,
                                                                            const detail::grid_operand<P>& x8,
                                                                            const detail::grid_operand<P>& w8,
                                                                            bool need_x, bool need_w) const
    {
        const auto g8 = detail::grid_operand_of<G>([&]() -> any_scaled_array<P> {
            if constexpr (std::same_as<Gin, G>) return g;
            else return ctx.scale(m_g, g, dtype_of<G>);
        }());
        return backward_products(ctx, g8, x8, w8, need_x, need_w);
    }

    /// backward's products, after the cast: compiled once, not once per cotangent type.
    [[nodiscard]] std::tuple<ScaledArray<X, P>, ScaledArray<W, P>> backward_products(scaling_context<P>& ctx,
                                                                                     const detail::grid_operand<P>& g8,
                                                                                     const detail::grid_operand<P>& x8,
                                                                                     const detail::grid_operand<P>& w8,
                                                                                     bool need_x, bool need_w) const
    {
        ScaledArray<X, P> gx;
        ScaledArray<W, P> gw;
        // The transposed operands are read in place (matmul_vjp's products), never copied.
        if (need_x) {
            gx = ctx.template apply<X>(m_grad_x, [&]<class St>(strategy_tag<St>) {
                return detail::grid_matmul_transposed_b<St>(g8, w8);
            });
        }
        if (need_w) {
            gw = ctx.template apply<W>(m_grad_w, [&]<class St>(strategy_tag<St>) {
                return detail::grid_matmul_transposed_a<St>(x8, g8);
            });
        }
        return {std::move(gx), std::move(gw)};  // an input that needs no gradient ignores its entry
    }

    template <class A, class B>
    static void check_shapes(const A& x, const B& w)
    {
        if (x.dimension() != 2 || w.dimension() != 2 || x.shape()[1] != w.shape()[0]) {
            SCALIFY_THROW(shape_error(fmt::format("autoscale::graph_linear: shapes {} and {} do not multiply (need "
                                                  "(batch, in) and (in, out))",
                                                  shape_string(x.shape()), shape_string(w.shape()))));
        }
    }
    scaling_context<P>* m_context;
    op_handle m_x, m_w, m_y, m_g, m_grad_x, m_grad_w;
};

// ---------------------------------------------------------------------------------------------
// Running a model written once under a context

/// A scaling strategy tag: vars of strategy autoscaled<Base, Layer> compute every op with Base's
/// rules, except matmul, which (found by ADL) runs as a Layer (a graph_linear) of the graph_scope
/// active on this thread. The model's code does not change:
///
///     using S = autoscale::autoscaled<unit_scaling>;
///     autoscale::scaling_context<pow2_scale> ctx({}, autoscale::on_off(1.0 / 3, 1.0 / 20));
///     for (...) {                                   // one scope per step: the matmuls are named
///         autoscale::graph_scope step(ctx);         // "matmul1", "matmul2", ... in call order
///         auto [loss, grads] = ad::value_and_grad<S>(model, params);
///     }
template <class Base = unit_scaling,
          class Layer = graph_linear<float8_e4m3fn, float8_e5m2, float, float, float, pow2_scale>>
struct autoscaled {
    static_assert(ScalingStrategy<Base>, "autoscaled: Base must be a scalify::ScalingStrategy");
    using base = Base;
    using layer = Layer;
    static constexpr bool needs_amax = Base::needs_amax;
    /// Its matmuls are layers, not Base's ops; they check a runtime_scaling list's choice (below),
    /// so a list may hold it.
    static constexpr bool changes_ops = true;
    static constexpr bool runtime_dispatch = true;
    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op, const scale_request& request)
    {
        return scaling_traits<Op, Base>::template output_scale<Policy>(request);
    }
};

/// Binds a context to this thread for one step of a model whose vars use an autoscaled strategy; its
/// matmuls become the layers "matmul1", "matmul2", ... in the order they run. Nests (the inner scope
/// wins); `inference` sets the context's inference mode for the scope (evaluation passes).
template <ScalePolicy P = pow2_scale>
class graph_scope {
public:
    explicit graph_scope(scaling_context<P>& context, bool inference = false)
        : m_context(&context), m_previous(current()), m_inference_before(context.inference())
    {
        context.set_inference(inference);
        current() = this;
    }
    ~graph_scope()
    {
        m_context->set_inference(m_inference_before);
        current() = m_previous;
    }
    graph_scope(const graph_scope&) = delete;
    graph_scope& operator=(const graph_scope&) = delete;

    /// The scope active on this thread, or nullptr.
    [[nodiscard]] static graph_scope*& current() noexcept
    {
        thread_local graph_scope* scope = nullptr;
        return scope;
    }
    [[nodiscard]] scaling_context<P>& context() const noexcept { return *m_context; }
    /// The next matmul's layer name: "matmul1", "matmul2", ...
    [[nodiscard]] std::string next_name() { return fmt::format("matmul{}", ++m_count); }

private:
    scaling_context<P>* m_context;
    graph_scope* m_previous;
    bool m_inference_before;
    std::size_t m_count = 0;
};

namespace detail {

template <class Layer, class X, class V>
[[nodiscard]] auto scoped_matmul(const X& x, const V& w)
{
    using P = typename Layer::policy;
    graph_scope<P>* scope = graph_scope<P>::current();
    if (scope == nullptr) {
        SCALIFY_THROW(config_error("autoscale: a matmul of autoscaled vars ran outside an autoscale::graph_scope (open "
                                   "one per step around the model)"));
    }
    Layer layer(scope->context(), scope->next_name());
    return layer(x, w);
}

/// Whether S is an autoscaled strategy.
template <class S>
inline constexpr bool is_autoscaled = false;
template <class Base, class Layer>
inline constexpr bool is_autoscaled<autoscaled<Base, Layer>> = true;

/// The first of Strategies that is autoscaled, else void.
template <class... Strategies>
struct first_autoscaled {
    using type = void;
};
template <class S, class... Rest>
struct first_autoscaled<S, Rest...> {
    using type = std::conditional_t<is_autoscaled<S>, S, typename first_autoscaled<Rest...>::type>;
};

/// The autoscaled strategy a runtime_scaling list holds (void: none; two: a static_assert).
template <class List>
struct listed_autoscaled {
    using type = void;
};
template <class... Strategies>
struct listed_autoscaled<runtime_scaling<Strategies...>> {
    static_assert((std::size_t{is_autoscaled<Strategies>} + ... + 0) <= 1,
                  "runtime_scaling: at most one autoscaled strategy per list (its matmuls would not know whose layer "
                  "to run)");
    using type = typename first_autoscaled<Strategies...>::type;
};

/// A matmul of vars under runtime_scaling list S holding autoscaled strategy A: A's Layer of the
/// active graph_scope while the thread's choice is A, the list's matmul (ad::matmul) otherwise.
template <class S, class A, class X, class W>
[[nodiscard]] auto runtime_matmul(const X& x, const W& w)
{
    using plain = decltype(ad::matmul(x, w));
    static_assert(std::same_as<decltype(scoped_matmul<typename A::layer>(x, w)), plain>,
                  "runtime_scaling with an autoscaled strategy: its layer's result type (graph_linear's Y) must be "
                  "the type the list's matmul gives these operands");
    if (S::current() == S::template index_of<A>) return scoped_matmul<typename A::layer>(x, w);
    return ad::matmul(x, w);
}

}  // namespace detail

/// matmul of vars under a runtime_scaling list that holds an autoscaled strategy (ADL): a layer
/// while that strategy is the thread's choice, the list's matmul otherwise (detail::runtime_matmul).
template <class T, class U, class P, class... Ss>
    requires(!std::is_void_v<typename detail::listed_autoscaled<runtime_scaling<Ss...>>::type>)
[[nodiscard]] auto matmul(const ad::var<T, P, runtime_scaling<Ss...>>& x, const ad::var<U, P, runtime_scaling<Ss...>>& w)
{
    using S = runtime_scaling<Ss...>;
    return detail::runtime_matmul<S, typename detail::listed_autoscaled<S>::type>(x, w);
}
template <class T, class U, class P, class... Ss>
    requires(!std::is_void_v<typename detail::listed_autoscaled<runtime_scaling<Ss...>>::type>)
[[nodiscard]] auto matmul(const ScaledArray<T, P>& x, const ad::var<U, P, runtime_scaling<Ss...>>& w)
{
    using S = runtime_scaling<Ss...>;
    return detail::runtime_matmul<S, typename detail::listed_autoscaled<S>::type>(x, w);
}
template <class T, class U, class P, class... Ss>
    requires(!std::is_void_v<typename detail::listed_autoscaled<runtime_scaling<Ss...>>::type>)
[[nodiscard]] auto matmul(const ad::var<T, P, runtime_scaling<Ss...>>& x, const ScaledArray<U, P>& w)
{
    using S = runtime_scaling<Ss...>;
    return detail::runtime_matmul<S, typename detail::listed_autoscaled<S>::type>(x, w);
}

/// matmul of vars under an autoscaled strategy (ADL): a Layer of the active graph_scope.
template <class T, class U, class P, class Base, class Layer>
[[nodiscard]] auto matmul(const ad::var<T, P, autoscaled<Base, Layer>>& x, const ad::var<U, P, autoscaled<Base, Layer>>& w)
{
    return detail::scoped_matmul<Layer>(x, w);
}
template <class T, class U, class P, class Base, class Layer>
[[nodiscard]] auto matmul(const ScaledArray<T, P>& x, const ad::var<U, P, autoscaled<Base, Layer>>& w)
{
    return detail::scoped_matmul<Layer>(x, w);
}
template <class T, class U, class P, class Base, class Layer>
[[nodiscard]] auto matmul(const ad::var<T, P, autoscaled<Base, Layer>>& x, const ScaledArray<U, P>& w)
{
    return detail::scoped_matmul<Layer>(x, w);
}

}  // namespace scalify::autoscale
