#pragma once
/// \file nn.hpp
/// softmax and log_softmax along an axis, computed on the value in compute_t with the max
/// subtracted, so no input scale can overflow them. softmax's output lies in [0, 1] and
/// log_softmax's in (-inf, 0]: natural scale 1 for both. Their rules see the axis length
/// (scale_request::axis_length) and the input scale.
///
///     auto p = softmax<unit_scaling>(logits, 1);      // data ~ unit RMS for unit-normal logits
///     auto lp = log_softmax<unit_scaling>(logits, 1);

#include <scalify/detail/lane_reduce.hpp>
#include <scalify/detail/parallel.hpp>
#include <scalify/numeric/math.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/reduce.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <ranges>
#include <type_traits>
#include <vector>

namespace scalify {

namespace detail {

/// The lanes of `shape` along `axis`: `outer` x `inner` of them, each `length` long with stride
/// `inner`; lane (o, j) starts at o * length * inner + j. shape_error naming the op if the axis
/// is out of range.
struct axis_lanes {
    std::size_t outer = 1, inner = 1, length = 0;

    template <class Shape>
    axis_lanes(const char* op, const Shape& shape, std::size_t axis)
    {
        if (axis >= shape.size()) {
            SCALIFY_THROW(shape_error(fmt::format("{}: axis {} out of range for shape {}", op, axis, shape_string(shape))));
        }
        for (std::size_t d = 0; d < axis; ++d) outer *= shape[d];
        for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
        length = shape[axis];
    }

    /// f(base, stride) for every lane, the lanes split across threads (parallel_lanes: each lane
    /// on one thread, in its own order, so results do not depend on the thread count). f must
    /// not throw and may write only its own lane's elements.
    template <class F>
    void for_each(F f) const
    {
        parallel_lanes(outer * inner, length, [&](std::size_t first, std::size_t last) {
            for (std::size_t lane = first; lane < last; ++lane) f((lane / inner) * length * inner + lane % inner, inner);
        });
    }

    /// Lanes along an axis other than the last, side by side: f(base, width) for blocks of up to
    /// lanes_across adjacent lanes (one outer index, inner indices base % inner onward), whose k-th
    /// elements are the `width` contiguous ones at base + k * inner; blocks split across threads
    /// (each on one thread). Walking such lanes one at a time touched a cache line per element
    /// (softmax along axis 0 of 2048 x 2048: 32x the last axis).
    template <class F>
    void for_each_block(F f) const
    {
        constexpr std::size_t block = lanes_across;
        const std::size_t per_outer = (inner + block - 1) / block;
        parallel_lanes(outer * per_outer, length * block, [&](std::size_t first, std::size_t last) {
            for (std::size_t b = first; b < last; ++b) {
                const std::size_t j = b % per_outer * block;
                f((b / per_outer) * length * inner + j, std::min(block, inner - j));
            }
        });
    }
};

/// A lane finisher whose result is a function of exp(v - max) and the lane's total alone
/// (from_exp(e, total)): normalise_along keeps the exps it sums.
template <class Finish>
concept finishes_from_exp = requires(const Finish& f, float e) { f.from_exp(e, e); };

/// softmax's element: exp(v - max) / total.
struct softmax_finish {
    template <class C>
    C operator()(C v, C top, C total, C) const noexcept { return from_exp(math::exp(v - top), total); }
    template <class C>
    C from_exp(C e, C total) const noexcept { return e / total; }
};

/// Per lane of the value: its max and total = sum exp(v - max), then element i's raw result
/// finish_lane(v_i, max, total, log(total)). Along the last axis (contiguous lanes) the results
/// are stored straight from the lanes' statistics (a periodic_source: no buffer of raw results to
/// zero, fill and copy); along another axis through a buffer, in blocks of lanes side by side.
template <class Op, class Strategy, class Out, class T, class P, class Finish>
[[nodiscard]] auto normalise_along(const char* op, const ScaledArray<T, P>& a, std::size_t axis, Finish finish_lane)
{
    using C = compute_t<T>;
    const axis_lanes lanes(op, a.shape(), axis);
    const C s = static_cast<C>(a.scale());
    const T* data = a.data().data();
    const auto value = [s, data](std::size_t i) { return bit_select(s == C(0), C(0), load(data[i]) * s); };  // zero scale: zeros
    struct lane_statistics {
        C top, total, log_total;
    };
    const auto statistics = [&](std::size_t base) {  // a lane of the last axis: contiguous, so its loops vectorise
        const auto lane_value = [&](std::size_t k) { return value(base + k); };
        const C top = lane_max<C>(lanes.length, lane_value, -std::numeric_limits<C>::infinity());
        const C total = lane_sum<C>(lanes.length, [&](std::size_t k) { return math::exp(lane_value(k) - top); });
        return lane_statistics{top, total, std::log(total)};
    };
    scale_request request;
    request.natural = 1.0f;
    request.input_scales[0] = a.scale();
    request.axis_length = lanes.length;
    if constexpr (finishes_from_exp<Finish> && std::same_as<out_or_t<Out, T>, C>) {
        if (lanes.inner == 1 && lanes.length != 0) {
            // A result that is a function of exp(v - max) (softmax's): the exps are stored into the
            // result as they are summed, one exp per element instead of two, in a loop of their own
            // (16 lanes wide where the sum has 8), the same values and order of the sum; the
            // result then finishes them in place from their lane's total.
            xt::xarray<C> exps = xt::xarray<C>::from_shape(a.shape());
            C* e = exps.data();
            std::vector<C> totals(lanes.outer);
            lanes.for_each([&](std::size_t base, std::size_t) {
                const C top = lane_max<C>(lanes.length, [&](std::size_t k) { return value(base + k); },
                                          -std::numeric_limits<C>::infinity());
                for (std::size_t k = 0; k < lanes.length; ++k) e[base + k] = math::exp(value(base + k) - top);
                totals[base / lanes.length] = lane_sum<C>(lanes.length, [&](std::size_t k) { return e[base + k]; });
            });
            const auto at = [e, totals = totals.data(), finish_lane](std::size_t i, std::size_t, std::size_t lane) {
                return finish_lane.from_exp(e[i], totals[lane]);
            };
            return finish<Op, Strategy, P, C, C>(op, a.shape(), request, periodic_source<decltype(at)>{at, lanes.length}, &exps);
        }
    }
    if (lanes.inner == 1 && lanes.length != 0) {
        std::vector<lane_statistics> per_lane(lanes.outer);
        lanes.for_each([&](std::size_t base, std::size_t) { per_lane[base / lanes.length] = statistics(base); });
        const lane_statistics* stats = per_lane.data();
        const auto at = [value, stats, finish_lane](std::size_t i, std::size_t, std::size_t lane) {
            return finish_lane(value(i), stats[lane].top, stats[lane].total, stats[lane].log_total);
        };
        return finish<Op, Strategy, P, out_or_t<Out, T>, C>(op, a.shape(), request,
                                                            periodic_source<decltype(at)>{at, lanes.length});
    }
    // Along another axis: blocks of adjacent lanes side by side (the same statistics per lane, the
    // same bits), their raw results through a buffer.
    C* const raw = scratch<C, Op>(a.size());
    const std::size_t stride = lanes.inner;
    lanes.for_each_block([&](std::size_t base, std::size_t width) {
        C top[lanes_across], total[lanes_across], log_total[lanes_across];
        lane_max_across<C>(lanes.length, width, [&](std::size_t k, std::size_t l) { return value(base + k * stride + l); },
                           -std::numeric_limits<C>::infinity(), top);
        lane_sum_across<C>(
            lanes.length, width, [&](std::size_t k, std::size_t l) { return math::exp(value(base + k * stride + l) - top[l]); },
            total);
        for (std::size_t l = 0; l < width; ++l) log_total[l] = std::log(total[l]);
        for (std::size_t k = 0; k < lanes.length; ++k) {
            for (std::size_t l = 0; l < width; ++l) {
                const std::size_t i = base + k * stride + l;
                raw[i] = finish_lane(value(i), top[l], total[l], log_total[l]);
            }
        }
    });
    return finish<Op, Strategy, P, out_or_t<Out, T>, C>(op, a.shape(), request, buffer_source<C>{raw});
}

}  // namespace detail

/// exp(a - logsumexp(a)) along `axis`. Natural scale 1; unit_scaling: the expected RMS of a
/// softmax of unit-normal logits at the input's scale (1.65 / L for scale 1 and large L).
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto softmax(const ScaledArray<T, P>& a, std::size_t axis)
{
    return detail::normalise_along<ops::softmax, Strategy, Out>("softmax", a, axis, detail::softmax_finish{});
}

/// a - logsumexp(a) along `axis`. Natural scale 1; unit_scaling: the expected RMS of the result
/// for unit-normal logits (about log L + sigma^2 / 2 for large L: the mean dominates).
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto log_softmax(const ScaledArray<T, P>& a, std::size_t axis)
{
    return detail::normalise_along<ops::log_softmax, Strategy, Out>(
        "log_softmax", a, axis, [](auto v, auto top, auto, auto log_total) { return (v - top) - log_total; });
}

// ---- backward rules -------------------------------------------------------------------------

// ---- softmax ----------------------------------------------------------------------------------

namespace detail {
/// A backward rule that sums each lane's terms (lane_sum of term(i) over the lane's elements i)
/// and computes each element from its lane's sum (element(i, sum)), stored under Strategy's rule
/// for Op: contiguous lanes straight from their sums (a periodic_source, no buffer of raw
/// results, as normalise_along), strided ones side by side through a buffer.
template <class Op, class Strategy, class Policy, class R, class C, class Shape, class Term, class Element>
[[nodiscard]] ScaledArray<R, Policy> finish_from_lanes(const char* op, const axis_lanes& lanes, const Shape& shape,
                                                       scale_request request, Term term, Element element)
{
    request.axis_length = lanes.length;
    if (lanes.inner == 1 && lanes.length != 0) {
        std::vector<C> sums(lanes.outer);
        lanes.for_each([&](std::size_t base, std::size_t) {
            sums[base / lanes.length] = lane_sum<C>(lanes.length, [&](std::size_t k) { return term(base + k); });
        });
        const auto at = [element, sums = sums.data()](std::size_t i, std::size_t, std::size_t lane) { return element(i, sums[lane]); };
        return finish<Op, Strategy, Policy, R, C>(op, shape, request, periodic_source<decltype(at)>{at, lanes.length});
    }
    C* const raw = scratch<C, Op>(element_count(shape));
    const std::size_t stride = lanes.inner;
    lanes.for_each_block([&](std::size_t base, std::size_t width) {
        C sums[lanes_across];
        lane_sum_across<C>(lanes.length, width, [&](std::size_t k, std::size_t l) { return term(base + k * stride + l); }, sums);
        for (std::size_t k = 0; k < lanes.length; ++k)
            for (std::size_t l = 0; l < width; ++l) raw[base + k * stride + l] = element(base + k * stride + l, sums[l]);
    });
    return finish<Op, Strategy, Policy, R, C>(op, shape, request, buffer_source<C>{raw});
}

/// softmax_vjp's body (see binary_body), the result stored as R.
template <class Strategy, class R, class G, class PG, class Y, class PY>
[[nodiscard]] auto softmax_vjp_body(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y, std::size_t axis)
{
    using C = std::common_type_t<compute_t<G>, compute_t<Y>>;
    detail::require_same_shape("softmax_vjp", g, y);
    const detail::axis_lanes lanes("softmax_vjp", y.shape(), axis);
    const G* pg = g.data().data();
    const Y* py = y.data().data();
    const C sy = static_cast<C>(y.scale());
    // sum g y over a lane in data units (its value is sg * sy * dot)
    const auto dot_term = [pg, py](std::size_t i) { return detail::load(pg[i]) * detail::load(py[i]); };
    const auto element = [pg, py, sy](std::size_t i, C dot) { return detail::load(py[i]) * (detail::load(pg[i]) - sy * dot); };
    scale_request request;
    request.natural = static_cast<float>(double(g.scale()) * double(y.scale()));  // value: sg sy raw
    request.input_scales[0] = g.scale();
    request.input_scales[1] = y.scale();
    request.input_count = 2;
    return finish_from_lanes<ops::vjp<ops::softmax>, Strategy, common_policy_t<PG, PY>, R, C>("softmax_vjp", lanes, y.shape(),
                                                                                             request, dot_term, element);
}
}  // namespace detail

/// y = softmax(x, axis), given y: y * (g - sum_axis(g * y)), computed in one pass in compute_t
/// and stored once (natural scale sg * sy); g and y of different element types are read in
/// their compute type. shape_error unless g and y have the same shape.
template <class Strategy = default_scaling, class G, class PG, class Y, class PY>
[[nodiscard]] auto softmax_vjp(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y, std::size_t axis)
{
    using C = std::common_type_t<compute_t<G>, compute_t<Y>>;
    return detail::softmax_vjp_body<Strategy, G>(detail::beside<C, Y>(g), detail::beside<C, G>(y), axis);
}

namespace detail {
/// log_softmax_vjp's body (see binary_body), the result stored as R.
template <class Strategy, class R, class G, class PG, class Y, class PY>
[[nodiscard]] ScaledArray<R, PG> log_softmax_vjp_body(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y, std::size_t axis)
{
    using C = std::common_type_t<compute_t<G>, compute_t<Y>>;
    detail::require_same_shape("log_softmax_vjp", g, y);
    const detail::axis_lanes lanes("log_softmax_vjp", y.shape(), axis);
    const G* pg = g.data().data();
    const Y* py = y.data().data();
    const C sy = static_cast<C>(y.scale());
    const auto total_term = [pg](std::size_t i) { return detail::load(pg[i]); };
    const auto element = [pg, py, sy](std::size_t i, C total) {
        const C probability = math::exp(detail::bit_select(sy == C(0), C(0), detail::load(py[i]) * sy));
        return detail::load(pg[i]) - probability * total;
    };
    scale_request request;
    request.natural = g.scale();
    request.input_scales[0] = g.scale();
    request.input_scales[1] = y.scale();
    request.input_count = 2;
    return finish_from_lanes<ops::vjp<ops::log_softmax>, Strategy, PG, R, C>("log_softmax_vjp", lanes, y.shape(), request,
                                                                              total_term, element);
}
}  // namespace detail

/// y = log_softmax(x, axis), given y: g - exp(y) * sum_axis(g), in one pass (natural scale sg);
/// g and y of different element types are read in their compute type. shape_error unless g and
/// y have the same shape.
template <class Strategy = default_scaling, class G, class PG, class Y, class PY>
[[nodiscard]] ScaledArray<G, PG> log_softmax_vjp(const ScaledArray<G, PG>& g, const ScaledArray<Y, PY>& y, std::size_t axis)
{
    using C = std::common_type_t<compute_t<G>, compute_t<Y>>;
    return detail::log_softmax_vjp_body<Strategy, G>(detail::beside<C, Y>(g), detail::beside<C, G>(y), axis);
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

/// softmax_cross_entropy's gradient, (softmax - onehot) / batch, as a row-by-row element source
/// (a named type: the store loop is compiled once, whatever the strategy and the labels' type).
struct cross_entropy_gradient {
    const double* exps;        ///< exp(v - top), row by row
    const double* totals;      ///< each row's sum of exps
    const std::size_t* targets;
    std::size_t batch;
    [[nodiscard]] double operator()(std::size_t i, std::size_t c, std::size_t b) const noexcept
    {
        const double p = exps[i] / totals[b];
        return (p - (c == targets[b] ? 1.0 : 0.0)) / static_cast<double>(batch);
    }
};

/// softmax_cross_entropy for checked targets, under a scale rule: compiled once per (NeedsAmax,
/// T, P). Rows run on the threads, each in its own order, and the rows' losses are summed in row
/// order, so neither the loss nor the gradient depends on the thread count. The exps live in a
/// per-thread buffer (a fresh batch x classes one cost its page faults on every call).
template <bool NeedsAmax, class T, ScalePolicy P>
[[nodiscard]] cross_entropy_result<T, P> softmax_cross_entropy_with(const ScaledArray<T, P>& logits,
                                                                    const std::vector<std::size_t>& target, scale_rule rule)
{
    const std::size_t batch = logits.shape()[0], classes = logits.shape()[1];
    const T* data = logits.data().data();
    const double s = logits.scale();
    const auto value = [data, s](std::size_t i) { return s == 0.0 ? 0.0 : static_cast<double>(load(data[i])) * s; };
    double* const exps = scratch<double, ops::softmax_cross_entropy>(batch * classes);
    std::vector<double> total(batch, 0.0), row_loss(batch, 0.0);
    parallel_lanes(batch, classes, [&](std::size_t first_row, std::size_t last_row) {
        for (std::size_t b = first_row; b < last_row; ++b) {
            const std::size_t first = b * classes;
            double top = -std::numeric_limits<double>::infinity(), sum = 0.0;
            for (std::size_t c = 0; c < classes; ++c) top = std::max(top, value(first + c));
            for (std::size_t c = 0; c < classes; ++c) {
                exps[first + c] = std::exp(value(first + c) - top);
                sum += exps[first + c];
            }
            total[b] = sum;
            row_loss[b] = std::log(sum) + top - value(first + target[b]);
        }
    });
    double loss = 0.0;
    for (const double term : row_loss) loss += term;

    scale_request request;
    request.natural = 1.0f;
    request.input_scales[0] = logits.scale();
    request.axis_length = classes;
    request.batch = batch;
    const cross_entropy_gradient at{exps, total.data(), target.data(), batch};
    auto grad = finish_by_rule<NeedsAmax, P, float, double>("softmax_cross_entropy", std::vector<std::size_t>{batch, classes},
                                                           request, rule,
                                                           periodic_source<cross_entropy_gradient>{at, std::max<std::size_t>(classes, 1)});
    return {batch ? loss / static_cast<double>(batch) : 0.0, std::move(grad)};
}
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
    const std::size_t classes = logits.shape()[1];
    std::vector<std::size_t> target(label_count);
    std::size_t row = 0;
    for (const auto label : labels) {
        const auto number = +label;  // promoted: character types print and compare as numbers
        if (std::cmp_less(number, 0) || std::cmp_greater_equal(number, classes)) {
            SCALIFY_THROW(shape_error(fmt::format("softmax_cross_entropy: label {} out of range for {} classes (row {})", number,
                                                  classes, row)));
        }
        target[row++] = static_cast<std::size_t>(number);
    }
    return detail::softmax_cross_entropy_with<detail::needs_amax_v<Strategy>, T, P>(
        logits, target, detail::rule_for<ops::vjp<ops::softmax_cross_entropy>, Strategy, P>());
}

/// softmax_cross_entropy(logits, {3, 1, 4}): labels as a braced list.
template <class Strategy = default_scaling, class T, class P, std::integral Label>
[[nodiscard]] cross_entropy_result<T, P> softmax_cross_entropy(const ScaledArray<T, P>& logits, std::initializer_list<Label> labels)
{
    return softmax_cross_entropy<Strategy>(logits, std::vector<Label>(labels));
}

}  // namespace scalify
