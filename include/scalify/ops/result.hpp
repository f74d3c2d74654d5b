#pragma once
/// \file result.hpp
/// The shared last step of every scaled op: ask the strategy for the output scale, then store
/// raw * natural / scale into the output type in one loop. Internal; ops use it.

#include <scalify/detail/parallel.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/non_finite.hpp>
#include <scalify/strategy/scaling.hpp>

#include <fmt/format.h>
#include <xtensor/xbroadcast.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

namespace scalify {

namespace detail {

/// Out defaults (void) to a type the op derives from its operands.
template <class Out, class Default>
using out_or_t = std::conditional_t<std::is_void_v<Out>, Default, Out>;

template <class Shape>
[[nodiscard]] std::size_t element_count(const Shape& shape) noexcept
{
    std::size_t n = 1;
    for (auto extent : shape) n *= static_cast<std::size_t>(extent);
    return n;
}

/// A rescale factor (a ratio of scales) applied as two multiplications when it is below C's
/// normal range, so that a tiny ratio (sa / sb = 2^-140, say) keeps its full precision instead of
/// becoming a subnormal with a few bits. zero: a zero-scale operand.
template <class C>
struct scale_factor {
    C high = C(1);
    C low = C(1);
    [[nodiscard]] constexpr bool zero() const noexcept { return high == C(0); }
    [[nodiscard]] constexpr C apply(C x) const noexcept { return x * high * low; }
};

template <class C>
[[nodiscard]] scale_factor<C> make_factor(double ratio) noexcept
{
    if (!(ratio > 0.0)) return {C(0), C(1)};
    if (ratio < static_cast<double>(std::numeric_limits<C>::min())) {
        return {static_cast<C>(std::ldexp(ratio, 100)), static_cast<C>(std::ldexp(1.0, -100))};
    }
    return {static_cast<C>(ratio), C(1)};
}

/// A zero-scale operand is a zero array, whatever its data hold (inf and NaN included).
template <class C, class T>
[[nodiscard]] constexpr C scaled_load(const T& x, scale_factor<C> factor) noexcept
{
    return factor.zero() ? C(0) : factor.apply(load(x));
}

/// |value| of a one-element array (0 for a zero scale), NaN for any other size: see
/// scale_request::single_values.
template <class T, class P>
[[nodiscard]] float single_magnitude(const ScaledArray<T, P>& a) noexcept
{
    if (a.size() != 1) return std::numeric_limits<float>::quiet_NaN();
    if (a.scale() == 0.0f) return 0.0f;
    return static_cast<float>(std::abs(static_cast<double>(load(a.data().data()[0])) * a.scale()));
}

/// a's values in type C, which is at least as wide as a's element type (so exactly), at a's
/// scale; a itself where it holds C. The edge at which an op whose operands have different
/// element types decodes them, so that its body is compiled once per compute type rather than
/// once per pair of storage types (docs/ops.md, "Arithmetic"): one pass over the narrow operand,
/// whose values the body would have widened to C element by element anyway.
template <class C, class T, class P>
[[nodiscard]] decltype(auto) in_type(const ScaledArray<T, P>& a)
{
    if constexpr (std::same_as<T, C>) {
        return (a);
    } else {
        static_assert(std::same_as<std::common_type_t<compute_t<T>, C>, C>, "in_type widens only");
        xt::xarray<C> data = xt::xarray<C>::from_shape(a.shape());
        const T* from = a.data().data();
        C* to = data.data();
        for (std::size_t i = 0; i < a.size(); ++i) to[i] = static_cast<C>(load(from[i]));
        return ScaledArray<C, P>(std::move(data), a.scale());
    }
}

/// x as an op's body reads it beside an operand of element type Other: as it is where both have
/// one type, else in the op's compute type C (in_type).
template <class C, class Other, class T, class P>
[[nodiscard]] decltype(auto) beside(const ScaledArray<T, P>& x)
{
    if constexpr (std::same_as<T, Other>) {
        return (x);
    } else {
        return in_type<C>(x);
    }
}

/// A scale the strategy returned, checked: finite, non-negative, and valid for Policy.
template <ScalePolicy Policy>
[[nodiscard]] float checked_output_scale(float scale, const char* op, const scale_request& request)
{
    if (!std::isfinite(scale) || scale < 0.0f) {
        SCALIFY_THROW(scale_error(fmt::format("{}: output scale {} is not finite and >= 0 (natural scale {}; the "
                                              "input scales over/underflow float32)",
                                              op, scale, request.natural)));
    }
    return checked_scale<Policy>(scale, op);
}

/// An element source over rows of `period` elements: at(i, j, row) gives element i, with j = i mod
/// period and row = i / period, so that an operand repeated along leading axes (a bias row over a
/// batch) is read in place with no broadcast copy, and per-row values (a lane's mean) are loop
/// invariants, in loops that still vectorise (no division per element).
template <class At>
struct periodic_source {
    At at;
    std::size_t period;
};

template <class Source>
inline constexpr bool is_periodic_source_v = false;
template <class At>
inline constexpr bool is_periodic_source_v<periodic_source<At>> = true;

/// body(i, source's element i) for i in [begin, end): source(i), or a periodic_source's at.
template <class Source, class Body>
[[gnu::always_inline]] inline void for_each_element(const Source& source, std::size_t begin, std::size_t end, Body&& body)
{
    if constexpr (is_periodic_source_v<Source>) {
        if (begin >= end) return;
        std::size_t i = begin;
        std::size_t j = begin % source.period;
        for (std::size_t row = begin / source.period; i < end; ++row) {
            const std::size_t stop = std::min(end, i + (source.period - j));
            for (; i < stop; ++i, ++j) body(i, source.at(i, j, row));
            j = 0;
        }
    } else {
        for (std::size_t i = begin; i < end; ++i) body(i, source(i));
    }
}

/// out[i] = store(source(i) x factor) over [begin, end). Out of line on purpose: inside a large
/// caller (matmul with Eigen's GEMM inlined) GCC stops inlining the element conversion and calls
/// it per element, several times slower (measured: bfloat16 results, 21 % of a bf16 epoch).
template <class Out, class C, class Source, class Factor>
[[gnu::noinline]] void store_range(Out* out, Source source, Factor factor, std::size_t begin, std::size_t end)
{
    if (factor.low == C(1)) {
        const C k = factor.high;  // the usual case: one multiplication, in a loop of its own
        for_each_element(source, begin, end, [out, k](std::size_t i, C raw) { out[i] = store<Out>(raw * k); });
    } else {
        for_each_element(source, begin, end, [out, factor](std::size_t i, C raw) { out[i] = store<Out>(factor.apply(raw)); });
    }
}

/// A strategy's scale rule for one (op, policy) as data: scaling_traits<Op, Strategy>::output_scale<Policy>.
/// Functions that take it at run time are compiled once for every strategy with the same
/// needs_amax, not once per strategy.
using scale_rule = float (*)(const scale_request&);

template <class Op, class Strategy, ScalePolicy Policy>
[[nodiscard]] constexpr scale_rule scale_rule_of() noexcept
{
    return &scaling_traits<Op, Strategy>::template output_scale<Policy>;
}

/// Strategy's rule for (Op, Policy), checked: the one static_assert a wrong Strategy argument gives
/// (nullptr then, and nothing behind it compiles further).
template <class Op, class Strategy, ScalePolicy Policy>
[[nodiscard]] constexpr scale_rule rule_for() noexcept
{
    static_assert(ScalingStrategy<Strategy>, "the Strategy argument does not satisfy scalify::ScalingStrategy");
    if constexpr (ScalingStrategy<Strategy>) return scale_rule_of<Op, Strategy, Policy>();
    else return nullptr;
}

/// Strategy::needs_amax (false for a type that is not a strategy: rule_for has reported it).
template <class Strategy>
inline constexpr bool needs_amax_v = [] {
    if constexpr (ScalingStrategy<Strategy>) return bool(Strategy::needs_amax);
    else return false;
}();

/// out[i] = store(source(i) x natural / scale) for i in [0, n): zeros for a zero scale or a zero
/// natural scale. `source` is taken by value: a local copy of the element lambda (pointers and
/// factors) that stores to `out` cannot alias, so the loop keeps them in registers and vectorises.
template <class Out, class C, class Source>
void store_scaled(Out* out, std::size_t n, float scale, float natural, Source source)
{
    if (scale == 0.0f || natural == 0.0f) {
        for (std::size_t i = 0; i < n; ++i) out[i] = store<Out>(C(0));
        return;
    }
    const auto factor = make_factor<C>(static_cast<double>(natural) / static_cast<double>(scale));
    parallel_ranges(n, [&, source](std::size_t, std::size_t begin, std::size_t end) {
        store_range<Out, C>(out, source, factor, begin, end);
    });
}

/// A raw result held in a buffer, as an element source.
template <class C>
struct buffer_source {
    const C* raw;
    [[nodiscard]] C operator()(std::size_t i) const noexcept { return raw[i]; }
};

/// The largest of measure(begin, end) over the thread ranges of [0, n) (0 for none).
template <class C, class Measure>
[[nodiscard]] C max_over_ranges(std::size_t n, Measure&& measure)
{
    std::vector<C> range_amax(parallel_range_count(n), C(0));
    parallel_ranges(n, [&](std::size_t range, std::size_t begin, std::size_t end) { range_amax[range] = measure(begin, end); });
    C amax = C(0);
    for (const C m : range_amax) amax = m > amax ? m : amax;
    return amax;
}

/// The largest finite |raw[i]|, 0 for none (finite_max, over the thread ranges); unlike
/// quantize.hpp's finite_amax, not agreed over ranks (an op's own result), and without
/// finite_amax_in's checked-mode report, which finish_measured's check_output makes on the stored
/// result as every op's finish does.
template <class C>
[[nodiscard]] C parallel_finite_amax(const C* raw, std::size_t n)
{
    return max_over_ranges<C>(n, [raw](std::size_t begin, std::size_t end) {
        C amax = C(0);
        for (std::size_t i = begin; i < end; ++i) amax = finite_max(amax, raw[i]);
        return amax;
    });
}

/// The end of finish_by_rule once the raw result is in `raw` and its finite amax known: the
/// rule's scale, the store, the checks. It depends on no op, so it is compiled once per (Policy,
/// Out, C), not once per op's element lambda.
template <ScalePolicy Policy, ScaledElement Out, class C>
[[nodiscard]] ScaledArray<Out, Policy> finish_measured(const char* op, xt::xarray<Out>&& data, scale_request request,
                                                       scale_rule rule, const C* raw, C amax)
{
    request.raw_amax = static_cast<float>(amax);
    const float scale = checked_output_scale<Policy>(rule(request), op, request);
    store_scaled<Out, C>(data.data(), data.size(), scale, request.natural, buffer_source<C>{raw});
    ScaledArray<Out, Policy> result(std::move(data), request.natural == 0.0f ? 0.0f : scale);
    check_output(op, result);
    return result;
}

/// A per-thread buffer of at least `count` values of C that only grows: an op's raw results, held
/// until their scale is known. A fresh zero-filled one per op cost its zero fill and page faults,
/// more than the op itself (add<dynamic_abs> of 4M floats, one thread: 119-124 -> 6.2-6.3 ms on Zen
/// 5; a 2048 x 64 x 2048 amax-scaled matmul 20x its GEMM). Tag keeps apart the buffers of code that
/// may hold them at once.
template <class C, class Tag>
[[nodiscard]] C* scratch(std::size_t count)
{
    thread_local std::vector<C> buffer;
    if (buffer.size() < count) buffer.resize(count);
    return buffer.data();
}

/// finish_by_rule's raw results (scratch's tag).
struct raw_result_tag {};

/// `rule`'s scale (NeedsAmax: the rule reads request.raw_amax); raw_at(i) gives element i of the
/// raw result in compute type C (value = raw * request.natural), or raw_at is a periodic_source.
/// Evaluates raw_at once per element. `reuse`, when not null and of `shape`, is the memory of an
/// expiring operand that raw_at reads element i of only for element i: the result is stored over it.
/// With NeedsAmax the raw result goes to a buffer first (a buffer_source is one already), measured
/// as it is written; only that loop is the op's own code, the rest is finish_measured's. Ops whose
/// raw result is a buffer pass it as a buffer_source: one store loop for all of them.
template <bool NeedsAmax, ScalePolicy Policy, ScaledElement Out, class C, class Shape, class RawAt>
[[nodiscard]] ScaledArray<Out, Policy> finish_by_rule(const char* op, const Shape& shape, scale_request request,
                                                      scale_rule rule, RawAt&& raw_at, xt::xarray<Out>* reuse = nullptr)
{
    const std::size_t n = element_count(shape);
    const bool reusable = reuse != nullptr && std::equal(reuse->shape().begin(), reuse->shape().end(), shape.begin(), shape.end());
    xt::xarray<Out> data = reusable ? std::move(*reuse) : xt::xarray<Out>::from_shape(shape);

    if constexpr (NeedsAmax && std::same_as<std::remove_cvref_t<RawAt>, buffer_source<C>>) {
        return finish_measured<Policy, Out, C>(op, std::move(data), request, rule, raw_at.raw, parallel_finite_amax(raw_at.raw, n));
    } else if constexpr (NeedsAmax) {
        // The raw result written and measured in one pass, into a per-thread scratch buffer.
        C* const raw = scratch<C, raw_result_tag>(n);
        const C amax = max_over_ranges<C>(n, [&](std::size_t begin, std::size_t end) {
            C range_amax = C(0);
            for_each_element(raw_at, begin, end, [raw, &range_amax](std::size_t i, C value) {
                raw[i] = value;
                range_amax = finite_max(range_amax, value);
            });
            return range_amax;
        });
        return finish_measured<Policy, Out, C>(op, std::move(data), request, rule, raw, amax);
    } else {
        const float scale = checked_output_scale<Policy>(rule(request), op, request);
        store_scaled<Out, C>(data.data(), n, scale, request.natural, raw_at);
        ScaledArray<Out, Policy> result(std::move(data), request.natural == 0.0f ? 0.0f : scale);
        check_output(op, result);
        return result;
    }
}

/// Strategy's scale for Op (finish_by_rule with scaling_traits<Op, Strategy>'s rule).
template <class Op, class Strategy, ScalePolicy Policy, ScaledElement Out, class C, class Shape, class RawAt>
[[nodiscard]] ScaledArray<Out, Policy> finish(const char* op, const Shape& shape, scale_request request, RawAt&& raw_at,
                                              xt::xarray<Out>* reuse = nullptr)
{
    static_assert(ScalingStrategy<Strategy>, "the Strategy argument does not satisfy scalify::ScalingStrategy");
    return finish_by_rule<Strategy::needs_amax, Policy, Out, C>(op, shape, request, scale_rule_of<Op, Strategy, Policy>(),
                                                                std::forward<RawAt>(raw_at), reuse);
}

/// Numpy broadcasting of two shapes, or shape_error naming both.
template <class ShapeA, class ShapeB>
[[nodiscard]] std::vector<std::size_t> broadcast_shapes(const char* op, const ShapeA& a, const ShapeB& b)
{
    const std::size_t rank = std::max(a.size(), b.size());
    std::vector<std::size_t> out(rank);
    for (std::size_t i = 0; i < rank; ++i) {
        const std::size_t ea = i < rank - a.size() ? 1 : static_cast<std::size_t>(a[i - (rank - a.size())]);
        const std::size_t eb = i < rank - b.size() ? 1 : static_cast<std::size_t>(b[i - (rank - b.size())]);
        if (ea != eb && ea != 1 && eb != 1) {
            SCALIFY_THROW(shape_error(fmt::format("{}: shapes {} and {} do not broadcast", op, shape_string(a),
                                                  shape_string(b))));
        }
        out[i] = ea == 1 ? eb : ea;
    }
    return out;
}

/// The period of x's data within `shape`'s when x is a block repeated along leading axes (its
/// shape after dropping leading 1s is a suffix of `shape`: a bias row over a batch, a scalar, or
/// x itself): x.size(); 0 for any other broadcast.
template <class T, class Shape>
[[nodiscard]] std::size_t repeated_block_size(const xt::xarray<T>& x, const Shape& shape) noexcept
{
    std::size_t skip = 0;
    while (skip < x.shape().size() && x.shape()[skip] == 1) ++skip;
    const std::size_t kept = x.shape().size() - skip;
    const bool suffix = kept <= shape.size() && std::equal(x.shape().begin() + static_cast<std::ptrdiff_t>(skip), x.shape().end(),
                                                           shape.end() - static_cast<std::ptrdiff_t>(kept));
    return suffix ? x.size() : 0;
}

/// Data of x laid out over `shape` (a copy only when broadcasting is needed).
template <class T, class Shape>
[[nodiscard]] const xt::xarray<T>& broadcast_to(const xt::xarray<T>& x, const Shape& shape, xt::xarray<T>& storage)
{
    if (x.shape().size() == shape.size() && std::equal(x.shape().begin(), x.shape().end(), shape.begin())) return x;
    // The common case, a bias row over a batch: x's data repeated; block copies instead of
    // strided assignment.
    if (const std::size_t block = repeated_block_size(x, shape); block != 0) {
        storage = xt::xarray<T>::from_shape(shape);
        T* out = storage.data();
        for (std::size_t at = 0; at < storage.size(); at += block) std::copy_n(x.data(), block, out + at);
        return storage;
    }
    storage = xt::broadcast(x, shape);
    return storage;
}

}  // namespace detail

// ---- backward rules -------------------------------------------------------------------------

/// The backward rules (vector-Jacobian products) sit beside the ops they differentiate: given
/// the gradient g of a scalar loss with respect to an op's output (the cotangent, always the first
/// argument) and the forward values they need, they return the gradients with respect to the op's
/// inputs. Each stores its result under its own op tag, ops::vjp<Op, Input>
/// (strategy/scaling.hpp), so the Strategy argument gives gradients their own scale rules;
/// unit_scaling's keep unit-scale cotangents at unit scale (docs/ops.md). Two-input rules return
/// a vjp_pair.
template <class GA, class GB>
struct vjp_pair {
    GA first;   ///< gradient with respect to the first input
    GB second;  ///< gradient with respect to the second input
};

}  // namespace scalify
