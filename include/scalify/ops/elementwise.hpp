#pragma once
/// \file elementwise.hpp
/// Element-wise scaled primitives: add, sub, mul, div, maximum, minimum, where (numpy
/// broadcasting), neg, abs, relu, gelu, tanh, exp, log, sqrt, and the scale-only ops
/// rebalance_scale and cast. Each computes in compute_t (float, or double for double data) and
/// stores once; docs/ops.md gives every scale rule.
///
///     auto c = add(a, b);                        // scale max(sa, sb), default_scaling
///     auto d = add<unit_scaling>(a, b);          // scale sqrt(sa^2 + sb^2)
///     auto e = mul<default_scaling, float>(a, b);  // result data stored as float

#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/math.hpp>
#include <scalify/ops/reduce.hpp>
#include <scalify/ops/result.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>

namespace scalify {

namespace detail {

template <class C>
[[nodiscard]] constexpr C nan_max(C x, C y) noexcept
{
    return (x != x || x > y) ? x : y;  // numpy.maximum: NaN in either operand propagates
}

template <class C>
[[nodiscard]] constexpr C nan_min(C x, C y) noexcept
{
    return (x != x || x < y) ? x : y;
}

/// The element functions of the binary ops, as types of their own: an op's body is compiled once
/// for its operand types whatever the strategy (a lambda written inside a strategy's op would be a
/// new type, and a new body, for every strategy).
struct plus_fn {
    template <class C>
    constexpr C operator()(C x, C y) const noexcept { return x + y; }
};
struct minus_fn {
    template <class C>
    constexpr C operator()(C x, C y) const noexcept { return x - y; }
};
struct nan_max_fn {
    template <class C>
    constexpr C operator()(C x, C y) const noexcept { return nan_max(x, y); }
};
struct nan_min_fn {
    template <class C>
    constexpr C operator()(C x, C y) const noexcept { return nan_min(x, y); }
};

/// binary_by_rule's body, for operands of one element type or both of the compute type C; the
/// result type R is explicit.
template <bool NeedsAmax, class R, class A, class PA, class B, class PB, class F>
[[nodiscard]] auto binary_body(const char* op, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, double ka,
                               double kb, scale_request request, scale_rule rule, F f, xt::xarray<R>* reuse)
{
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    using P = common_policy_t<PA, PB>;
    static_assert(ScaledElement<R>, "the output type must be float, double, a minifloat, Eigen::half or Eigen::bfloat16");
    const auto shape = broadcast_shapes(op, a.shape(), b.shape());
    xt::xarray<A> a_storage;
    xt::xarray<B> b_storage;
    const A* pa = broadcast_to(a.data(), shape, a_storage).data();
    // b read in place where it repeats along leading axes (a bias or a gain row over a batch:
    // no copy of it over the whole shape), else laid out over the shape.
    std::size_t period = repeated_block_size(b.data(), shape);
    const B* pb = period != 0 ? b.data().data() : broadcast_to(b.data(), shape, b_storage).data();
    if (period == 0) period = element_count(shape);
    const auto ca = make_factor<C>(ka), cb = make_factor<C>(kb);
    request.input_scales[0] = a.scale();
    request.input_scales[1] = b.scale();
    request.input_count = 2;
    request.single_values[0] = single_magnitude(a);
    request.single_values[1] = single_magnitude(b);
    if (ca.low == C(1) && cb.low == C(1)) {
        // The usual case, one multiplication per operand: a loop of its own so it stays lean.
        const C ka_single = ca.high, kb_single = cb.high;
        const auto at = [=](std::size_t i, std::size_t j, std::size_t) {
            return f(ka_single == C(0) ? C(0) : load(pa[i]) * ka_single, kb_single == C(0) ? C(0) : load(pb[j]) * kb_single);
        };
        return finish_by_rule<NeedsAmax, P, R, C>(op, shape, request, rule, periodic_source<decltype(at)>{at, period}, reuse);
    }
    const auto at = [=](std::size_t i, std::size_t j, std::size_t) { return f(scaled_load(pa[i], ca), scaled_load(pb[j], cb)); };
    return finish_by_rule<NeedsAmax, P, R, C>(op, shape, request, rule, periodic_source<decltype(at)>{at, period}, reuse);
}

/// Binary op whose raw result is f(x * ka, y * kb) with natural scale `natural`, its scale from
/// `rule` (strategy-free: see finish_by_rule). `reuse`: see finish_by_rule (expiring_buffer).
/// Operands of different element types are read in their compute type (beside).
template <bool NeedsAmax, class Out, class A, class PA, class B, class PB, class F>
[[nodiscard]] auto binary_by_rule(const char* op, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, double ka,
                                  double kb, scale_request request, scale_rule rule, F f,
                                  xt::xarray<out_or_t<Out, promote_t<A, B>>>* reuse = nullptr)
{
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    return binary_body<NeedsAmax, out_or_t<Out, promote_t<A, B>>>(op, beside<C, B>(a), beside<C, A>(b), ka, kb, request,
                                                                   rule, f, reuse);
}

/// The memory of an expiring operand (an rvalue ScaledArray) that has the result's element type
/// R, for the result to be stored over (finish_by_rule checks its shape): a's, else b's, else
/// nullptr. An rvalue argument is the caller's to overwrite, so the const_cast is sound.
template <class R, class X, class Y>
[[nodiscard]] xt::xarray<R>* expiring_buffer(X&& a, Y&& b) noexcept
{
    using A = std::remove_cvref_t<X>;
    using B = std::remove_cvref_t<Y>;
    if constexpr (!std::is_lvalue_reference_v<X> && !std::is_const_v<std::remove_reference_t<X>> &&
                  std::same_as<typename A::value_type, R>) {
        if (a.size() >= b.size()) return &const_cast<xt::xarray<R>&>(a.data());
    }
    if constexpr (!std::is_lvalue_reference_v<Y> && !std::is_const_v<std::remove_reference_t<Y>> &&
                  std::same_as<typename B::value_type, R>) {
        return &const_cast<xt::xarray<R>&>(b.data());
    }
    return nullptr;
}

/// binary_by_rule under Strategy's rule for Op.
template <class Op, class Strategy, class Out, class A, class PA, class B, class PB, class F>
[[nodiscard]] auto binary(const char* op, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, double ka,
                          double kb, scale_request request, F f)
{
    return binary_by_rule<needs_amax_v<Strategy>, Out>(op, a, b, ka, kb, request,
                                                       rule_for<Op, Strategy, common_policy_t<PA, PB>>(), f);
}

/// add/sub/maximum/minimum: both operands brought to m = max(sa, sb).
template <bool NeedsAmax, class Out, class A, class PA, class B, class PB, class F>
[[nodiscard]] auto common_scale_binary_by_rule(const char* op, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b,
                                               scale_rule rule, F f,
                                               xt::xarray<out_or_t<Out, promote_t<A, B>>>* reuse = nullptr)
{
    const float m = std::max(a.scale(), b.scale());
    scale_request request;
    request.natural = m;
    const double ka = m == 0.0f ? 0.0 : double(a.scale()) / m;
    const double kb = m == 0.0f ? 0.0 : double(b.scale()) / m;
    return binary_by_rule<NeedsAmax, Out>(op, a, b, ka, kb, request, rule, f, reuse);
}
template <class Op, class Strategy, class Out, class A, class PA, class B, class PB, class F>
[[nodiscard]] auto common_scale_binary(const char* op, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, F f,
                                       xt::xarray<out_or_t<Out, promote_t<A, B>>>* reuse = nullptr)
{
    return common_scale_binary_by_rule<needs_amax_v<Strategy>, Out>(
        op, a, b, rule_for<Op, Strategy, common_policy_t<PA, PB>>(), f, reuse);
}

/// Unary op with raw = f(data) and the given natural scale, its scale from `rule`.
template <bool NeedsAmax, class Out, class T, class P, class F>
[[nodiscard]] auto unary_by_rule(const char* op, const ScaledArray<T, P>& a, float natural, scale_rule rule, F f)
{
    using C = compute_t<T>;
    using R = out_or_t<Out, T>;
    const T* pa = a.data().data();
    scale_request request;
    request.natural = natural;
    request.input_scales[0] = a.scale();
    return finish_by_rule<NeedsAmax, P, R, C>(op, a.shape(), request, rule, [=](std::size_t i) { return f(load(pa[i])); });
}

}  // namespace detail

// ---- binary -----------------------------------------------------------------------------------

/// a + b. Natural scale max(sa, sb); the other operand is rescaled into it. An expiring operand
/// (an rvalue) of the result's type and shape has the result stored over its memory (the same
/// bits; no new array).
template <class Strategy = default_scaling, class Out = void, AnyScaledArray X, AnyScaledArray Y>
[[nodiscard]] auto add(X&& a, Y&& b)
{
    using R = detail::out_or_t<Out, promote_t<typename std::remove_cvref_t<X>::value_type, typename std::remove_cvref_t<Y>::value_type>>;
    return detail::common_scale_binary<ops::add, Strategy, Out>("add", a, b, detail::plus_fn{},
                                                                detail::expiring_buffer<R>(std::forward<X>(a), std::forward<Y>(b)));
}

/// a - b. As add.
template <class Strategy = default_scaling, class Out = void, AnyScaledArray X, AnyScaledArray Y>
[[nodiscard]] auto sub(X&& a, Y&& b)
{
    using R = detail::out_or_t<Out, promote_t<typename std::remove_cvref_t<X>::value_type, typename std::remove_cvref_t<Y>::value_type>>;
    return detail::common_scale_binary<ops::sub, Strategy, Out>("sub", a, b, detail::minus_fn{},
                                                                detail::expiring_buffer<R>(std::forward<X>(a), std::forward<Y>(b)));
}

/// Element-wise maximum (NaN propagates). Natural scale max(sa, sb); a zero-scale operand is
/// zeros, so maximum(a, zeros) is relu(a) at a's scale.
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB>
[[nodiscard]] auto maximum(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return detail::common_scale_binary<ops::maximum, Strategy, Out>("maximum", a, b, detail::nan_max_fn{});
}

/// Element-wise minimum (NaN propagates). As maximum.
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB>
[[nodiscard]] auto minimum(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return detail::common_scale_binary<ops::minimum, Strategy, Out>("minimum", a, b, detail::nan_min_fn{});
}

namespace detail {

/// a * b under `rule` (ops::mul's, or that of a gradient that is a product).
template <bool NeedsAmax, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto multiply_by_rule(const char* op, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, scale_rule rule)
{
    scale_request request;
    request.natural = static_cast<float>(double(a.scale()) * b.scale());
    const float ka = a.scale() == 0.0f ? 0.0f : 1.0f, kb = b.scale() == 0.0f ? 0.0f : 1.0f;
    return binary_by_rule<NeedsAmax, Out>(op, a, b, ka, kb, request, rule, [](auto x, auto y) { return x * y; });
}
template <class Op, class Strategy, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto multiply(const char* op, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return multiply_by_rule<needs_amax_v<Strategy>, Out>(op, a, b, rule_for<Op, Strategy, common_policy_t<PA, PB>>());
}

/// a / b under `rule` (ops::div's, or that of a gradient that is a quotient).
template <bool NeedsAmax, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto divide_by_rule(const char* op, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, scale_rule rule)
{
    scale_request request;
    const auto quotient = [](auto x, auto y) { return x / y; };
    if (b.scale() == 0.0f) {
        request.natural = 1.0f;
        return binary_by_rule<NeedsAmax, Out>(op, a, b, a.scale(), 0.0f, request, rule, quotient);
    }
    request.natural = static_cast<float>(double(a.scale()) / b.scale());
    const float ka = a.scale() == 0.0f ? 0.0f : 1.0f;
    return binary_by_rule<NeedsAmax, Out>(op, a, b, ka, 1.0f, request, rule, quotient);
}
template <class Op, class Strategy, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto divide(const char* op, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return divide_by_rule<needs_amax_v<Strategy>, Out>(op, a, b, rule_for<Op, Strategy, common_policy_t<PA, PB>>());
}

}  // namespace detail

/// a * b. Natural scale sa * sb; the data multiply as they are.
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB>
[[nodiscard]] auto mul(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return detail::multiply<ops::mul, Strategy, Out>("mul", a, b);
}

/// a / b. Natural scale sa / sb. Dividing by a zero-scale (zero) array gives IEEE x/0: +-inf,
/// or NaN where a is also zero (the result then has scale 1).
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB>
[[nodiscard]] auto div(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return detail::divide<ops::div, Strategy, Out>("div", a, b);
}

namespace detail {
template <class Strategy, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto where(const xt::xarray<bool>& cond, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b);
}  // namespace detail

/// cond ? a : b, with numpy broadcasting over all three. Natural scale max(sa, sb). cond is an
/// evaluated xt::xarray<bool>. (Three reference overloads and forwarding references so that,
/// found by ADL next to xt::where, this one is the better match.)
template <class Strategy = default_scaling, class Out = void, AnyScaledArray SA, AnyScaledArray SB>
[[nodiscard]] auto where(const xt::xarray<bool>& cond, SA&& a, SB&& b)
{
    return detail::where<Strategy, Out>(cond, a, b);
}
template <class Strategy = default_scaling, class Out = void, AnyScaledArray SA, AnyScaledArray SB>
[[nodiscard]] auto where(xt::xarray<bool>& cond, SA&& a, SB&& b)
{
    return detail::where<Strategy, Out>(std::as_const(cond), a, b);
}
template <class Strategy = default_scaling, class Out = void, AnyScaledArray SA, AnyScaledArray SB>
[[nodiscard]] auto where(xt::xarray<bool>&& cond, SA&& a, SB&& b)
{
    return detail::where<Strategy, Out>(std::as_const(cond), a, b);
}

namespace detail {
template <bool NeedsAmax, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto where_by_rule(const xt::xarray<bool>& cond, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b,
                                 scale_rule rule);
}  // namespace detail

template <class Strategy, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto detail::where(const xt::xarray<bool>& cond, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return where_by_rule<needs_amax_v<Strategy>, Out>(cond, a, b, rule_for<ops::where, Strategy, common_policy_t<PA, PB>>());
}

namespace detail {
/// where_by_rule's body (see binary_body).
template <bool NeedsAmax, class R, class A, class PA, class B, class PB>
[[nodiscard]] auto where_body(const xt::xarray<bool>& cond, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b,
                              scale_rule rule);
}  // namespace detail

/// Operands of different element types are read in their compute type (beside).
template <bool NeedsAmax, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto detail::where_by_rule(const xt::xarray<bool>& cond, const ScaledArray<A, PA>& a,
                                         const ScaledArray<B, PB>& b, scale_rule rule)
{
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    return where_body<NeedsAmax, out_or_t<Out, promote_t<A, B>>>(cond, beside<C, B>(a), beside<C, A>(b), rule);
}

template <bool NeedsAmax, class R, class A, class PA, class B, class PB>
[[nodiscard]] auto detail::where_body(const xt::xarray<bool>& cond, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b,
                                      scale_rule rule)
{
    const auto shape = detail::broadcast_shapes("where", cond.shape(), detail::broadcast_shapes("where", a.shape(), b.shape()));
    xt::xarray<bool> cond_storage;
    const bool* pc = detail::broadcast_to(cond, shape, cond_storage).data();
    xt::xarray<A> a_storage;
    xt::xarray<B> b_storage;
    const A* pa = detail::broadcast_to(a.data(), shape, a_storage).data();
    const B* pb = detail::broadcast_to(b.data(), shape, b_storage).data();
    const float m = std::max(a.scale(), b.scale());
    scale_request request;
    request.natural = m;
    request.input_scales[0] = a.scale();
    request.input_scales[1] = b.scale();
    request.input_count = 2;
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    const auto ka = detail::make_factor<C>(m == 0.0f ? 0.0 : double(a.scale()) / m);
    const auto kb = detail::make_factor<C>(m == 0.0f ? 0.0 : double(b.scale()) / m);
    return detail::finish_by_rule<NeedsAmax, common_policy_t<PA, PB>, R, C>("where", shape, request, rule, [=](std::size_t i) {
        return pc[i] ? detail::scaled_load(pa[i], ka) : detail::scaled_load(pb[i], kb);
    });
}

// ---- with a scalar ------------------------------------------------------------------------------

namespace detail {

/// x * c: |c| folds into the scale (under pow2_scale only its power-of-two part; the rest, in
/// [1, 2), multiplies the data), its sign into the data. c = 0 gives a zero array; c inf or NaN
/// multiplies the data (results inf/NaN as IEEE).
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> scale_by(const char* op, ScaledArray<T, P> a, double c)
{
    using C = compute_t<T>;
    const float a_scale = a.scale();
    if (c == 0.0) return ScaledArray<T, P>(std::move(a).release_data(), 0.0f);
    double fold = std::abs(c);
    double data_factor = c < 0 ? -1.0 : 1.0;
    if (!std::isfinite(c)) {
        fold = 1.0;
        data_factor = c;
    } else if constexpr (P::power_of_two) {
        int exponent = 0;
        const double mantissa = std::frexp(fold, &exponent);  // fold = mantissa * 2^exponent
        fold = std::ldexp(1.0, exponent - 1);
        data_factor *= 2.0 * mantissa;
    }
    const double scale = double(a_scale) * fold;
    if (!(scale <= double(std::numeric_limits<float>::max()))) {
        SCALIFY_THROW(scale_error(fmt::format("{}: scale {} times {} overflows float32", op, a_scale, c)));
    }
    xt::xarray<T> data = std::move(a).release_data();  // a is this function's own copy (or moved in)
    if (data_factor != 1.0) {
        T* values = data.data();
        const auto k = static_cast<C>(data_factor);
        for (std::size_t i = 0; i < data.size(); ++i) values[i] = store<T>(load(values[i]) * k);
    }
    return ScaledArray<T, P>(std::move(data), static_cast<float>(scale));
}

}  // namespace detail

/// a * c for a scalar c: folds into the scale (see detail::scale_by); data unchanged for c > 0
/// under float_scale and for powers of two under pow2_scale.
/// An expiring a (an rvalue) is scaled in its own memory.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> mul(ScaledArray<T, P> a, double c)
{
    return detail::scale_by("mul", std::move(a), c);
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> mul(double c, ScaledArray<T, P> a)
{
    return detail::scale_by("mul", std::move(a), c);
}
/// a / c for a scalar c: as mul(a, 1 / c), with 1 / c formed in double.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> div(ScaledArray<T, P> a, double c)
{
    return detail::scale_by("div", std::move(a), 1.0 / c);
}

// ---- unary --------------------------------------------------------------------------------------

namespace detail {

struct negate_fn {
    template <class C>
    constexpr C operator()(C x) const noexcept { return -x; }
};
struct magnitude_fn {
    template <class C>
    constexpr C operator()(C x) const noexcept { return x < 0 ? -x : x; }
};
struct relu_fn {
    template <class C>
    constexpr C operator()(C x) const noexcept { return x > 0 || x != x ? x : C(0); }
};
struct sqrt_fn {
    template <class C>
    C operator()(C x) const noexcept { return std::sqrt(x); }
};

/// The unary ops that compute on the value (their element function needs the scale), each
/// strategy-free under `rule` (see binary_by_rule).
template <bool NeedsAmax, class T, class P>
[[nodiscard]] ScaledArray<T, P> gelu_by_rule(const ScaledArray<T, P>& a, scale_rule rule)
{
    using C = compute_t<T>;
    const C s = static_cast<C>(a.scale());
    return unary_by_rule<NeedsAmax, T>("gelu", a, a.scale(), rule, [s](C x) {
        const C v = x * s;
        return C(0.5) * x * (C(1) + math::erf(v * C(0.70710678118654752440)));  // float: scalify's erf
    });
}
template <bool NeedsAmax, class T, class P>
[[nodiscard]] ScaledArray<T, P> tanh_by_rule(const ScaledArray<T, P>& a, scale_rule rule)
{
    using C = compute_t<T>;
    const C s = static_cast<C>(a.scale());
    const float natural = std::min(a.scale(), 1.0f);
    const C inverse_natural = natural == 0.0f ? C(0) : static_cast<C>(1.0 / double(natural));
    return unary_by_rule<NeedsAmax, T>("tanh", a, natural, rule, [=](C x) { return std::tanh(x * s) * inverse_natural; });
}
template <bool NeedsAmax, class T, class P>
[[nodiscard]] ScaledArray<T, P> exp_by_rule(const ScaledArray<T, P>& a, scale_rule rule)
{
    using C = compute_t<T>;
    const C s = static_cast<C>(a.scale());
    return unary_by_rule<NeedsAmax, T>("exp", a, 1.0f, rule, [s](C x) { return bit_select(s == C(0), C(1), math::exp(x * s)); });
}
template <bool NeedsAmax, class T, class P>
[[nodiscard]] ScaledArray<T, P> log_by_rule(const ScaledArray<T, P>& a, scale_rule rule)
{
    using C = compute_t<T>;
    const C log_scale = a.scale() == 0.0f ? C(0) : static_cast<C>(std::log(double(a.scale())));
    const bool zero = a.scale() == 0.0f;
    return unary_by_rule<NeedsAmax, T>("log", a, 1.0f, rule, [=](C x) {
        return zero ? -std::numeric_limits<C>::infinity() : std::log(x) + log_scale;
    });
}

}  // namespace detail

/// -a: data negated, scale kept.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> neg(const ScaledArray<T, P>& a)
{
    return detail::unary_by_rule<detail::needs_amax_v<Strategy>, T>("neg", a, a.scale(),
                                                                   detail::rule_for<ops::neg, Strategy, P>(), detail::negate_fn{});
}

/// |a|: scale kept.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> abs(const ScaledArray<T, P>& a)
{
    return detail::unary_by_rule<detail::needs_amax_v<Strategy>, T>("abs", a, a.scale(),
                                                                   detail::rule_for<ops::abs, Strategy, P>(), detail::magnitude_fn{});
}

/// max(a, 0) (NaN propagates): scale kept, since relu never grows a magnitude.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> relu(const ScaledArray<T, P>& a)
{
    return detail::unary_by_rule<detail::needs_amax_v<Strategy>, T>("relu", a, a.scale(),
                                                                   detail::rule_for<ops::relu, Strategy, P>(), detail::relu_fn{});
}

/// x * Phi(x), the exact (erf) form, computed on the value: scale kept, since |gelu(x)| <= |x|.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> gelu(const ScaledArray<T, P>& a)
{
    return detail::gelu_by_rule<detail::needs_amax_v<Strategy>>(a, detail::rule_for<ops::gelu, Strategy, P>());
}

/// tanh(a), computed on the value: natural scale min(sa, 1), since |tanh(x)| <= min(|x|, 1), so
/// the data never grow.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> tanh(const ScaledArray<T, P>& a)
{
    return detail::tanh_by_rule<detail::needs_amax_v<Strategy>>(a, detail::rule_for<ops::tanh, Strategy, P>());
}

/// e^a, computed on the value in float; natural scale 1, since exp's output range does not
/// depend on the input's scale (use dynamic_abs to fit it to a format).
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> exp(const ScaledArray<T, P>& a)
{
    return detail::exp_by_rule<detail::needs_amax_v<Strategy>>(a, detail::rule_for<ops::exp, Strategy, P>());
}

/// log(a) = log(data) + log(scale): the scale enters additively, so the result has natural
/// scale 1. Zero gives -inf, negatives NaN.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> log(const ScaledArray<T, P>& a)
{
    return detail::log_by_rule<detail::needs_amax_v<Strategy>>(a, detail::rule_for<ops::log, Strategy, P>());
}

/// sqrt(a) = sqrt(data) * sqrt(scale). Under pow2_scale sqrt(scale) is exact for an even
/// exponent; for an odd one the scale rounds to a power of two and sqrt(2)^+-1 folds into the data.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> sqrt(const ScaledArray<T, P>& a)
{
    const auto natural = static_cast<float>(std::sqrt(double(a.scale())));
    return detail::unary_by_rule<detail::needs_amax_v<Strategy>, T>("sqrt", a, natural,
                                                                   detail::rule_for<ops::sqrt, Strategy, P>(), detail::sqrt_fn{});
}

// ---- scale only ---------------------------------------------------------------------------------

/// Same value, scale multiplied by `factor` and data divided by it (exact for a power of two
/// barring data over/underflow). factor must be finite and > 0, and a power of two under pow2_scale.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> rebalance_scale(const ScaledArray<T, P>& a, float factor)
{
    if (!(factor > 0.0f) || !std::isfinite(factor)) {
        SCALIFY_THROW(scale_error(fmt::format("rebalance_scale: factor must be finite and > 0, got {}", factor)));
    }
    if constexpr (P::power_of_two) {
        if (!is_pow2_or_zero(factor)) {
            SCALIFY_THROW(scale_error(fmt::format("rebalance_scale: pow2_scale needs a power-of-two factor, got {}", factor)));
        }
    }
    const double scale = double(a.scale()) * factor;
    if (!(scale <= double(std::numeric_limits<float>::max()))) {
        SCALIFY_THROW(scale_error(fmt::format("rebalance_scale: scale {} times {} overflows float32", a.scale(), factor)));
    }
    using C = compute_t<T>;
    xt::xarray<T> data = xt::xarray<T>::from_shape(a.shape());
    const T* in = a.data().data();
    T* out = data.data();
    const C k = static_cast<C>(1.0 / double(factor));
    detail::parallel_ranges(a.size(), [in, out, k](std::size_t, std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) out[i] = detail::store<T>(detail::load(in[i]) * k);
    });
    return ScaledArray<T, P>(std::move(data), static_cast<float>(scale));
}

/// Data converted to U with the given rounding and saturation; scale forwarded, no rescale.
template <ScaledElement U, RoundingPolicy Rounding = round_nearest_even, SaturationPolicy Saturation = no_saturation,
          class T, class P>
    requires DeterministicRounding<Rounding>
[[nodiscard]] ScaledArray<U, P> cast(const ScaledArray<T, P>& a)
{
    if constexpr (std::same_as<U, T>) {
        ScaledArray<U, P> result(a.data(), a.scale());
        detail::check_output("cast", result);
        return result;
    } else {
        xt::xarray<U> data = xt::xarray<U>::from_shape(a.shape());
        const T* in = a.data().data();
        U* out = data.data();
        detail::parallel_ranges(a.size(), [in, out](std::size_t, std::size_t begin, std::size_t end) {
            if constexpr (EncodedFloat<U>) {
                convert_n<U, Rounding, Saturation>(std::span<const T>(in + begin, end - begin), std::span<U>(out + begin, end - begin));
            } else {
                for (std::size_t i = begin; i < end; ++i) out[i] = static_cast<U>(detail::load(in[i]));
            }
        });
        ScaledArray<U, P> result(std::move(data), a.scale());
        detail::check_output("cast", result);  // an overflow without saturation is NaN or inf
        return result;
    }
}

/// Stochastic cast: element i rounds with the counter-based random bits at (seed, i), so the
/// result depends only on the data and the seed.
template <ScaledElement U, RoundingPolicy Rounding, SaturationPolicy Saturation = no_saturation, class T, class P>
    requires StochasticRounding<Rounding> && EncodedFloat<U>
[[nodiscard]] ScaledArray<U, P> cast(const ScaledArray<T, P>& a, std::uint64_t seed)
{
    xt::xarray<U> data = xt::xarray<U>::from_shape(a.shape());
    convert_n<U, Rounding, Saturation>(std::span<const T>(a.data().data(), a.size()), std::span<U>(data.data(), a.size()),
                                       seed);
    return ScaledArray<U, P>(std::move(data), a.scale());
}

// ---- backward rules -------------------------------------------------------------------------

namespace detail {

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

/// pointwise_vjp_by_rule's body (see binary_body), the result stored as R.
template <bool NeedsAmax, class R, class G, class PG, class X, class PX, class Derivative>
[[nodiscard]] ScaledArray<R, PG> pointwise_vjp_body(const char* op, const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x,
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
    return finish_by_rule<NeedsAmax, PG, R, C>(op, shape, request, rule, [=](std::size_t i) {
        const C xv = bit_select(sx == C(0), C(0), load(px[i]) * sx);  // a zero-scale x is zeros (masks: vectorises)
        return load(pg[i]) * derivative(xv);
    });
}

/// g * f'(x) for a pointwise op, stored under Op's rule with g's type and policy (natural scale
/// sg; the request's input scales are {sg, sx}). `derivative` maps x's value to f'(x). g and x of
/// different element types are read in their compute type (beside).
template <bool NeedsAmax, class G, class PG, class X, class PX, class Derivative>
[[nodiscard]] ScaledArray<G, PG> pointwise_vjp_by_rule(const char* op, const ScaledArray<G, PG>& g, const ScaledArray<X, PX>& x,
                                                       scale_rule rule, Derivative derivative)
{
    using C = std::common_type_t<compute_t<G>, compute_t<X>>;
    return pointwise_vjp_body<NeedsAmax, G>(op, beside<C, X>(g), beside<C, G>(x), rule, derivative);
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
    /// Phi(v) + v phi(v) given erf_term = erf(v / sqrt 2) (gelu's forward pass has it).
    template <class C>
    static C from_erf(C v, C erf_term) noexcept
    {
        const C cdf = C(0.5) * (C(1) + erf_term);
        const C pdf = math::exp(C(-0.5) * v * v) * C(0.39894228040143267794);  // float: scalify's exp
        return cdf + rounded_product(v, pdf);  // not fused into an FMA under any -ffp-contract
    }
    template <class C>
    C operator()(C v) const noexcept
    {
        return from_erf(v, math::erf(v * C(0.70710678118654752440)));  // float: scalify's erf
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

/// y = a + b (broadcasting): ga = g, gb = g, each summed back to its operand's shape (a sum of N
/// cotangent elements: sqrt(N) under default_scaling and unit_scaling). Where no axis is summed,
/// the gradient is g itself, data and scale.
template <class Strategy = default_scaling, class G, class P, class SA, class SB>
[[nodiscard]] auto add_vjp(const ScaledArray<G, P>& g, const SA& a_shape, const SB& b_shape)
{
    return vjp_pair<ScaledArray<G, P>, ScaledArray<G, P>>{detail::unbroadcast<Strategy, ops::vjp<ops::add, 0>>(g, a_shape),
                                                          detail::unbroadcast<Strategy, ops::vjp<ops::add, 1>>(g, b_shape)};
}
/// The same from an expiring cotangent: the operand of g's own shape takes g's memory.
template <class Strategy = default_scaling, class G, class P, class SA, class SB>
[[nodiscard]] auto add_vjp(ScaledArray<G, P>&& g, const SA& a_shape, const SB& b_shape)
{
    using pair = vjp_pair<ScaledArray<G, P>, ScaledArray<G, P>>;
    if (detail::broadcast_axes(g.shape(), a_shape).empty()) {
        auto gb = detail::unbroadcast<Strategy, ops::vjp<ops::add, 1>>(std::as_const(g), b_shape);
        return pair{std::move(g), std::move(gb)};
    }
    auto ga = detail::unbroadcast<Strategy, ops::vjp<ops::add, 0>>(std::as_const(g), a_shape);
    return pair{std::move(ga), detail::unbroadcast<Strategy, ops::vjp<ops::add, 1>>(std::move(g), b_shape)};
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

// ---- unary backward rules ---------------------------------------------------------------------

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

namespace detail {

/// gelu(a) under `rule` and, into derivative[i], gelu_derivative_fn at element i's value (what
/// gelu_vjp multiplies the cotangent by), both from one erf: gelu_by_rule's values and
/// gelu_derivative_fn's bits. A differentiated gelu keeps the derivatives for its backward pass,
/// which is then one multiplication (gelu_vjp_from_derivative) instead of an erf and an exp.
template <bool NeedsAmax, class T, class P>
[[nodiscard]] ScaledArray<T, P> gelu_and_derivative_by_rule(const ScaledArray<T, P>& a, scale_rule rule, compute_t<T>* derivative)
{
    using C = compute_t<T>;
    const C s = static_cast<C>(a.scale());
    const T* pa = a.data().data();
    scale_request request;
    request.natural = a.scale();
    request.input_scales[0] = a.scale();
    auto result = finish_by_rule<NeedsAmax, P, T, C>("gelu", a.shape(), request, rule, [=](std::size_t i) {
        const C x = load(pa[i]);
        const C erf_term = math::erf(x * s * C(0.70710678118654752440));
        // gelu_derivative_fn at the value, a zero-scale x being zeros (as pointwise_vjp reads it:
        // then v = 0 and erf(0) = 0)
        const bool zero = s == C(0);
        derivative[i] = gelu_derivative_fn::from_erf(bit_select(zero, C(0), x * s), bit_select(zero, C(0), erf_term));
        return C(0.5) * x * (C(1) + erf_term);
    });
    if (result.scale() == 0.0f) {
        // A zero result scale (a zero-scale x, or a rule's zero) stores zeros without evaluating
        // the elements above: the derivatives on their own, as gelu_derivative_fn gives them.
        for (std::size_t i = 0; i < a.size(); ++i) derivative[i] = gelu_derivative_fn{}(bit_select(s == C(0), C(0), load(pa[i]) * s));
    }
    return result;
}

/// gelu_vjp(g, x) from the derivatives gelu_and_derivative_by_rule kept for x (same shape as g):
/// the same product g * f'(x), request and rule, so the same bits.
template <class Strategy, class G, class PG, class C>
[[nodiscard]] ScaledArray<G, PG> gelu_vjp_from_derivative(const ScaledArray<G, PG>& g, float x_scale, const C* derivative)
{
    const G* pg = g.data().data();
    scale_request request;
    request.natural = g.scale();
    request.input_scales[0] = g.scale();
    request.input_scales[1] = x_scale;
    request.input_count = 2;
    return finish_by_rule<needs_amax_v<Strategy>, PG, G, C>("gelu_vjp", g.shape(), request,
                                                          rule_for<ops::vjp<ops::gelu>, Strategy, PG>(),
                                                          [=](std::size_t i) { return load(pg[i]) * derivative[i]; });
}

}  // namespace detail

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

}  // namespace scalify

#ifdef SCALIFY_SEPARATE_COMPILATION  // scalify::compiled holds these (detail/compiled_instances.hpp)
#include <scalify/detail/compiled_instances.hpp>
SCALIFY_CAST_INSTANCES(extern template)
#endif
