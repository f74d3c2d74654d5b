#pragma once
/// \file grad.hpp
/// value_and_grad / grad over parameter trees, in the style of jax.value_and_grad.
///
/// A parameter tree is a ScaledArray, a std::vector / std::array / std::map<std::string, ...> of
/// trees, or a user struct template whose fields are all of its template parameter and which
/// lists them once for ADL:
///
///     template <class A>
///     struct mlp {
///         A w1, b1, w2, b2;
///         template <class F>
///         friend void for_each_parameter(mlp& self, F&& f) { f(self.w1); f(self.b1); f(self.w2); f(self.b2); }
///     };
///
///     mlp<ScaledArray<float, pow2_scale>> params = ...;
///     auto [loss, grads] = ad::value_and_grad<unit_scaling>(
///         [&](const auto& p) { return softmax_cross_entropy(forward(p, x), labels); }, params);
///     // grads: mlp<ad::gradient<pow2_scale>>, each with its own propagated scale
///
/// The function gets the same tree with every ScaledArray replaced by an ad::var watched on a
/// fresh tape; it returns a scalar var. The tape and its graph are freed before value_and_grad
/// returns.

#include <scalify/autodiff/ops.hpp>
#include <scalify/autodiff/tape.hpp>

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace scalify::ad {

namespace detail {

template <class X>
inline constexpr bool is_gradient_v = false;
template <class P>
inline constexpr bool is_gradient_v<gradient<P>> = true;

template <class X>
inline constexpr bool is_tree_leaf_v = scalify::is_scaled_array_v<X> || is_var_v<X> || is_gradient_v<X>;

template <class X>
inline constexpr bool is_std_vector_v = false;
template <class X, class Alloc>
inline constexpr bool is_std_vector_v<std::vector<X, Alloc>> = true;

template <class X>
inline constexpr bool is_std_array_v = false;
template <class X, std::size_t N>
inline constexpr bool is_std_array_v<std::array<X, N>> = true;

template <class X>
inline constexpr bool is_string_map_v = false;
template <class X>
inline constexpr bool is_string_map_v<std::map<std::string, X>> = true;

/// A user struct S<A> that lists its fields through for_each_parameter.
template <class X>
struct parameter_struct : std::false_type {};
template <template <class> class S, class A>
    requires(!is_tree_leaf_v<S<A>>) && requires(S<A>& s) { for_each_parameter(s, [](auto&) {}); }  // clang 14 matched gradient<P>
struct parameter_struct<S<A>> : std::true_type {
    using field_type = A;
    template <class B>
    using rebind = S<B>;
};

/// The first leaf type of a tree (its ScalePolicy is the tree's).
template <class X>
struct first_leaf {
    using type = X;
};
template <class X>
    requires(is_std_vector_v<X> || is_std_array_v<X> || is_string_map_v<X>)
struct first_leaf<X> {
    using type = typename first_leaf<typename X::value_type>::type;
};
template <class K, class X>
struct first_leaf<std::pair<const K, X>> {
    using type = typename first_leaf<X>::type;
};
template <class X>
    requires parameter_struct<X>::value
struct first_leaf<X> {
    using type = typename first_leaf<typename parameter_struct<X>::field_type>::type;
};

/// The tree with f applied to every leaf, same structure.
template <class Tree, class F>
[[nodiscard]] auto tree_map(const Tree& tree, F& f)
{
    if constexpr (is_tree_leaf_v<Tree>) {
        return f(tree);
    } else if constexpr (is_std_vector_v<Tree>) {
        std::vector<decltype(tree_map(tree.front(), f))> out;
        out.reserve(tree.size());
        for (const auto& item : tree) out.push_back(tree_map(item, f));
        return out;
    } else if constexpr (is_std_array_v<Tree>) {
        return [&]<std::size_t... I>(std::index_sequence<I...>) {
            return std::array{tree_map(tree[I], f)...};
        }(std::make_index_sequence<std::tuple_size_v<Tree>>{});
    } else if constexpr (is_string_map_v<Tree>) {
        std::map<std::string, decltype(tree_map(tree.begin()->second, f))> out;
        for (const auto& [name, item] : tree) out.emplace(name, tree_map(item, f));
        return out;
    } else if constexpr (parameter_struct<Tree>::value) {
        using A = typename parameter_struct<Tree>::field_type;
        using B = decltype(tree_map(std::declval<const A&>(), f));
        std::vector<const A*> fields;
        for_each_parameter(const_cast<Tree&>(tree), [&](auto& field) {  // the hook takes Self&; nothing is written
            static_assert(std::same_as<std::remove_cvref_t<decltype(field)>, A>,
                          "for_each_parameter: every field of a parameter struct S<A> must be an A");
            fields.push_back(&field);
        });
        typename parameter_struct<Tree>::template rebind<B> out{};
        std::size_t i = 0;
        for_each_parameter(out, [&](B& field) { field = tree_map(*fields[i++], f); });
        return out;
    } else {
        static_assert(is_tree_leaf_v<Tree>,
                      "not a parameter tree: use ScaledArrays, std::vector / std::array / std::map<std::string, ...> of "
                      "trees, or a struct template S<A> with a for_each_parameter hook (see autodiff/grad.hpp)");
    }
}

/// Calls f(a_leaf, b_leaf) on the leaves of two trees of the same structure.
template <class TreeA, class TreeB, class F>
void tree_zip(TreeA& a, const TreeB& b, F& f)
{
    if constexpr (is_tree_leaf_v<std::remove_const_t<TreeA>>) {
        f(a, b);
    } else if constexpr (is_std_vector_v<std::remove_const_t<TreeA>> || is_std_array_v<std::remove_const_t<TreeA>>) {
        if (a.size() != b.size()) {
            SCALIFY_THROW(shape_error(fmt::format("parameter trees differ: {} entries and {} entries", a.size(), b.size())));
        }
        for (std::size_t i = 0; i < a.size(); ++i) tree_zip(a[i], b[i], f);
    } else if constexpr (is_string_map_v<std::remove_const_t<TreeA>>) {
        for (auto& [name, item] : a) {
            const auto found = b.find(name);
            if (found == b.end()) SCALIFY_THROW(shape_error(fmt::format("parameter trees differ: no entry '{}'", name)));
            tree_zip(item, found->second, f);
        }
    } else {
        using A = typename parameter_struct<std::remove_const_t<TreeA>>::field_type;
        using B = typename parameter_struct<TreeB>::field_type;
        std::vector<const B*> others;
        for_each_parameter(const_cast<TreeB&>(b), [&](auto& field) { others.push_back(&field); });
        std::size_t i = 0;
        for_each_parameter(a, [&](auto& field) {
            static_assert(std::same_as<std::remove_cvref_t<decltype(field)>, A>);
            tree_zip(field, *others[i++], f);
        });
    }
}

}  // namespace detail

/// The value of a function and its gradients with respect to the parameters.
template <class Value, class Grads>
struct value_and_grad_result {
    Value value;  ///< the function's (scalar) result, a ScaledArray
    Grads grads;  ///< one gradient tree per parameter tree (a std::tuple when there are several)
};

namespace detail {

/// Whether value_and_grad's template argument is a strategy: the check comes first, and nothing
/// else is instantiated when it fails, so a wrong argument gives one error, not hundreds.
template <class Strategy>
consteval bool checked_strategy()
{
    static_assert(ScalingStrategy<Strategy>,
                  "value_and_grad<Strategy> / grad<Strategy>: Strategy must be a scaling strategy (default_scaling, "
                  "unit_scaling, natural_scaling, dynamic_abs<T>, ...: see scalify::ScalingStrategy). A scale policy "
                  "such as pow2_scale is not one: it is the parameters' ScaledArray<T, Policy> type");
    return ScalingStrategy<Strategy>;
}

/// Whether value_and_grad's parameters are parameter trees of ScaledArrays, checked first for the
/// same reason.
template <class... Params>
consteval bool checked_parameters()
{
    constexpr bool trees = (is_tree_leaf_v<typename first_leaf<Params>::type> && ...);
    static_assert(trees,
                  "value_and_grad / grad: each parameter must be a ScaledArray or a tree of them (std::vector, "
                  "std::array, std::map<std::string, ...>, or a struct template S<A> with a for_each_parameter hook: "
                  "see autodiff/grad.hpp); wrap plain data with as_scaled_array");
    return trees;
}

/// The leaf function that watches a parameter on `recording`: a named type, so that the trees of
/// vars it makes have types a caller can name before any tape exists (watched_tree_t).
template <class Strategy, ScalePolicy P>
struct leaf_watcher {
    tape<P>* recording;
    template <class Leaf>
    [[nodiscard]] auto operator()(const Leaf& leaf) const
    {
        return recording->template watch_in_place<Strategy>(leaf);
    }
};

/// Tree with every leaf a var of Strategy: what value_and_grad's function receives for Tree.
template <class Strategy, ScalePolicy P, class Tree>
using watched_tree_t = decltype(tree_map(std::declval<const Tree&>(), std::declval<leaf_watcher<Strategy, P>&>()));

/// The scale policy of a parameter list (its first leaf's).
template <class... Params>
using params_policy_t = typename first_leaf<std::tuple_element_t<0, std::tuple<Params...>>>::type::scale_policy;

/// value_and_grad's step for parameters Params and a function returning Out, the function behind
/// a pointer: compiled once per parameter and result types, not once per call site (each site's
/// function is a lambda, a type of its own; inlined per site, this body was 0.4 CPU-s of g++ -O2
/// each). `observer` (ad::inspect's, else null) observes the tape while the function runs and
/// during the backward sweep.
template <class Strategy, class Out, class... Params>
[[nodiscard]] auto recorded_value_and_grad(tape_observer* observer,
                                           Out (*call)(const void*, const watched_tree_t<Strategy, params_policy_t<Params...>, Params>&...),
                                           const void* f, const Params&... params)
{
    using P = params_policy_t<Params...>;

    tape<P> recording;
    const observing_scope observing(observer, recording);
    // The parameters are read in place (no copy per call): f must not change them.
    leaf_watcher<Strategy, P> watch{&recording};
    // Braced initialisation evaluates left to right: parameters are watched in order.
    auto vars = std::tuple<watched_tree_t<Strategy, P, Params>...>{detail::tree_map(params, watch)...};
    const Out output = std::apply([&](const auto&... v) { return call(f, v...); }, std::as_const(vars));
    if (output.size() != 1) {
        SCALIFY_THROW(autodiff_error(fmt::format(
            "value_and_grad: the function returned shape {} ({} elements); gradients need a scalar result (reduce it, "
            "or use ad::tape::backward with a seed cotangent)",
            shape_string(output.shape()), output.size())));
    }
    if (!output.requires_grad()) {
        SCALIFY_THROW(autodiff_error("value_and_grad: the result does not depend on any parameter"));
    }
    recording.backward(output);

    std::size_t position = 0;
    auto read = [&](const auto& leaf) -> gradient<P> {
        ++position;
        try {
            return recording.take_gradient(leaf);  // the tape dies here: move, do not copy
        } catch (const autodiff_error&) {
            SCALIFY_THROW(autodiff_error(fmt::format(
                "value_and_grad: parameter leaf {} (shape {}) is not part of the graph: the result does not depend on it",
                position, shape_string(leaf.shape()))));
        }
    };
    auto grads = std::apply(
        [&](const auto&... v) { return std::tuple<decltype(detail::tree_map(v, read))...>{detail::tree_map(v, read)...}; }, vars);
    if constexpr (sizeof...(Params) == 1) {
        return value_and_grad_result<typename Out::array_type, std::tuple_element_t<0, decltype(grads)>>{
            output.value(), std::move(std::get<0>(grads))};
    } else {
        return value_and_grad_result<typename Out::array_type, decltype(grads)>{output.value(), std::move(grads)};
    }
}

/// value_and_grad's step: f's result type checked, then recorded_value_and_grad with f behind a
/// pointer (its one per-site piece is the call).
template <class Strategy, class F, class... Params>
[[nodiscard]] auto checked_value_and_grad(tape_observer* observer, F&& f, const Params&... params)
{
    static_assert(sizeof...(Params) > 0, "value_and_grad: give at least one parameter tree");
    using P = params_policy_t<Params...>;
    using Function = std::remove_reference_t<F>;
    using Out = std::remove_cvref_t<std::invoke_result_t<Function&, const watched_tree_t<Strategy, P, Params>&...>>;
    static_assert(detail::is_var_v<Out>, "value_and_grad: the function must return an ad::var (its scalar result)");
    if constexpr (detail::is_var_v<Out>) {
        Out (*call)(const void*, const watched_tree_t<Strategy, P, Params>&...) =
            [](const void* function, const watched_tree_t<Strategy, P, Params>&... vars) -> Out {
            return (*static_cast<Function*>(const_cast<void*>(function)))(vars...);
        };
        return recorded_value_and_grad<Strategy, Out>(observer, call, std::addressof(f), params...);
    } else {
        return value_and_grad_result<int, int>{};  // never used: the static_assert above has failed
    }
}

}  // namespace detail

/// f(params as vars...) and the gradient of its scalar result with respect to every leaf of
/// every parameter tree, each an ad::gradient<P> with its own propagated scale. Every op of f
/// uses Strategy. autodiff_error when the result is not a scalar, or when it does not depend on
/// a parameter (naming the parameter's position and shape). The parameters are read in place,
/// not copied: f must not modify them (a var of a parameter that f lets escape gets its own copy).
template <class Strategy = default_scaling, class F, class... Params>
[[nodiscard]] auto value_and_grad(F&& f, const Params&... params)
{
    if constexpr (detail::checked_strategy<Strategy>() && detail::checked_parameters<Params...>()) {
        return detail::checked_value_and_grad<Strategy>(nullptr, std::forward<F>(f), params...);
    } else {
        return value_and_grad_result<int, int>{};  // never used: a static_assert above has failed
    }
}

/// The gradients only (see value_and_grad).
template <class Strategy = default_scaling, class F, class... Params>
[[nodiscard]] auto grad(F&& f, const Params&... params)
{
    return value_and_grad<Strategy>(std::forward<F>(f), params...).grads;
}

}  // namespace scalify::ad
