#pragma once
/// \file reduce.hpp
/// Reductions: reduce_sum (natural scale s; default_scaling grows it by sqrt(N) for N summed
/// elements, so a sum of unit-variance data stays unit variance), reduce_mean (natural s / N, so
/// s / sqrt(N) under those rules) and reduce_max (scale kept).
/// Over all elements (a 0-d result) or over the listed axes. Sums accumulate in compute_t.
///
///     auto total = reduce_sum(a);          // shape ()
///     auto rows  = reduce_max(a, {1});     // one per row

#include <scalify/ops/result.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace scalify {

namespace detail {

/// Output shape and strides of a reduction over `axes` (sorted, unique, in range or shape_error).
struct reduction_plan {
    std::vector<std::size_t> out_shape;
    std::vector<std::size_t> axes;
    std::size_t count = 1;  ///< elements per output
};

template <class Shape>
[[nodiscard]] reduction_plan plan_reduction(const char* op, const Shape& shape, std::vector<std::size_t> axes)
{
    reduction_plan plan;
    std::sort(axes.begin(), axes.end());
    for (std::size_t i = 0; i < axes.size(); ++i) {
        if (axes[i] >= shape.size() || (i > 0 && axes[i] == axes[i - 1])) {
            // "[0, 3]", as fmt/ranges.h would print it (not included: its parsing costs every TU).
            SCALIFY_THROW(shape_error(fmt::format("{}: axes [{}] are not distinct axes of an array of shape {}", op,
                                                  detail::joined(axes, ", "), shape_string(shape))));
        }
    }
    for (std::size_t d = 0; d < shape.size(); ++d) {
        if (std::binary_search(axes.begin(), axes.end(), d)) plan.count *= shape[d];
        else plan.out_shape.push_back(shape[d]);
    }
    plan.axes = std::move(axes);
    return plan;
}

/// Applies combine(accumulator, element) over the reduced axes, from `init`, in compute type C.
/// Row-major walk of the input; each element lands in its output slot, so memory is read once.
template <class C, class T, class Shape, class Combine>
[[nodiscard]] std::vector<C> reduce_axes(const T* data, const Shape& shape, const reduction_plan& plan, C init,
                                         Combine combine)
{
    std::vector<C> out(element_count(plan.out_shape), init);
    const std::size_t rank = shape.size();
    const std::size_t n = element_count(shape);
    if (n == 0) return out;
    // Reduced axes that are all leading (a bias gradient's column sum) or all trailing (a row
    // sum): the same element order as the general walk below, in loops the compiler vectorises.
    const std::size_t reduced = plan.axes.size();
    const bool leading = reduced > 0 && plan.axes.back() == reduced - 1;
    const bool trailing = reduced > 0 && plan.axes.front() == rank - reduced;
    if (leading) {
        const std::size_t width = out.size(), rows = n / width;
        C* o = out.data();
        for (std::size_t r = 0; r < rows; ++r) {
            const T* row = data + r * width;
            for (std::size_t j = 0; j < width; ++j) o[j] = combine(o[j], load(row[j]));
        }
        return out;
    }
    if (trailing) {
        const std::size_t width = n / out.size();
        for (std::size_t r = 0; r < out.size(); ++r) {
            const T* row = data + r * width;
            C acc = out[r];
            for (std::size_t j = 0; j < width; ++j) acc = combine(acc, load(row[j]));
            out[r] = acc;
        }
        return out;
    }
    // Output stride of each input axis (0 for reduced axes).
    std::vector<std::size_t> out_stride(rank, 0);
    std::size_t stride = 1;
    for (std::size_t d = rank; d-- > 0;) {
        if (!std::binary_search(plan.axes.begin(), plan.axes.end(), d)) {
            out_stride[d] = stride;
            stride *= shape[d];
        }
    }
    std::vector<std::size_t> index(rank, 0);
    std::size_t slot = 0;
    for (std::size_t i = 0; i < n; ++i) {
        out[slot] = combine(out[slot], load(data[i]));
        for (std::size_t d = rank; d-- > 0;) {  // odometer increment, keeping slot in step
            if (++index[d] < shape[d]) {
                slot += out_stride[d];
                break;
            }
            slot -= out_stride[d] * (shape[d] - 1);
            index[d] = 0;
        }
    }
    return out;
}

template <class T>
[[nodiscard]] std::vector<std::size_t> all_axes(std::size_t rank)
{
    std::vector<std::size_t> axes(rank);
    for (std::size_t d = 0; d < rank; ++d) axes[d] = d;
    return axes;
}

/// The accumulations of the reductions, as types of their own (see elementwise.hpp's plus_fn).
struct sum_fn {
    template <class C>
    constexpr C operator()(C acc, C x) const noexcept { return acc + x; }
};
struct nan_max_accumulate_fn {
    template <class C>
    constexpr C operator()(C acc, C x) const noexcept { return (acc != acc || acc > x) ? acc : x; }
};
/// The natural scale's factor for N elements per output: 1 for a sum, 1/N for a mean.
[[nodiscard]] inline double per_output_one(std::size_t) noexcept { return 1.0; }
[[nodiscard]] inline double per_output_mean(std::size_t count) noexcept
{
    return count == 0 ? 1.0 : 1.0 / static_cast<double>(count);
}

/// combine over `axes`, stored under `rule` with natural scale s * per_count(N), N the elements
/// per output. Strategy-free (see finish_by_rule).
template <bool NeedsAmax, class Out, class T, class P, class C, class Combine>
[[nodiscard]] auto reduce_by_rule(const char* op, const ScaledArray<T, P>& a, std::vector<std::size_t> axes, C init,
                                  Combine combine, double (*per_count)(std::size_t), scale_rule rule)
{
    const auto plan = plan_reduction(op, a.shape(), std::move(axes));
    const std::vector<C> raw = reduce_axes(a.data().data(), a.shape(), plan, init, combine);
    scale_request request;
    request.natural = static_cast<float>(double(a.scale()) * per_count(plan.count));
    request.input_scales[0] = a.scale();
    request.contraction = std::max<std::size_t>(plan.count, 1);  // an empty reduction: one term (0, or NaN for a mean)
    request.single_values[0] = single_magnitude(a);
    return finish_by_rule<NeedsAmax, P, out_or_t<Out, T>, C>(op, plan.out_shape, request, rule, buffer_source<C>{raw.data()});
}
template <class Op, class Strategy, class Out, class T, class P, class C, class Combine>
[[nodiscard]] auto reduce(const char* op, const ScaledArray<T, P>& a, std::vector<std::size_t> axes, C init, Combine combine,
                          double (*per_count)(std::size_t) = per_output_one)
{
    return reduce_by_rule<needs_amax_v<Strategy>, Out>(op, a, std::move(axes), init, combine, per_count,
                                                       rule_for<Op, Strategy, P>());
}

}  // namespace detail

/// Sum over `axes` (all when omitted). Natural scale s, contraction N = elements per output.
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto reduce_sum(const ScaledArray<T, P>& a, std::vector<std::size_t> axes)
{
    using C = compute_t<T>;
    return detail::reduce<ops::reduce_sum, Strategy, Out>("reduce_sum", a, std::move(axes), C(0), detail::sum_fn{});
}
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto reduce_sum(const ScaledArray<T, P>& a)
{
    return reduce_sum<Strategy, Out>(a, detail::all_axes<T>(a.dimension()));
}

/// Mean over `axes` (all when omitted): the sum in compute_t with natural scale s / N, N the
/// elements per output; default_scaling and unit_scaling give s / sqrt(N) (a mean of N
/// unit-variance values has standard deviation 1 / sqrt(N)). An empty reduction gives NaN, as
/// numpy's mean does.
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto reduce_mean(const ScaledArray<T, P>& a, std::vector<std::size_t> axes)
{
    using C = compute_t<T>;
    // An empty sum is 0; 0 / 0 is NaN: start the (never combined) accumulator there.
    const bool empty = detail::element_count(a.shape()) == 0;
    const C init = empty ? std::numeric_limits<C>::quiet_NaN() : C(0);
    return detail::reduce<ops::reduce_mean, Strategy, Out>("reduce_mean", a, std::move(axes), init, detail::sum_fn{},
                                                           detail::per_output_mean);
}
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto reduce_mean(const ScaledArray<T, P>& a)
{
    return reduce_mean<Strategy, Out>(a, detail::all_axes<T>(a.dimension()));
}

/// Maximum over `axes` (all when omitted); NaN propagates; an empty reduction gives -inf.
/// Scale kept.
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto reduce_max(const ScaledArray<T, P>& a, std::vector<std::size_t> axes)
{
    using C = compute_t<T>;
    return detail::reduce<ops::reduce_max, Strategy, Out>(
        "reduce_max", a, std::move(axes), -std::numeric_limits<C>::infinity(), detail::nan_max_accumulate_fn{});
}
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto reduce_max(const ScaledArray<T, P>& a)
{
    return reduce_max<Strategy, Out>(a, detail::all_axes<T>(a.dimension()));
}

// ---- backward rules -------------------------------------------------------------------------

namespace detail {

/// The axes of a cotangent of shape `from` that broadcasting added or stretched from `shape`
/// (empty: the shapes are equal). shape_error if `shape` does not broadcast to `from`.
template <class From, class Shape>
[[nodiscard]] std::vector<std::size_t> broadcast_axes(const From& from, const Shape& shape)
{
    const std::size_t rank = from.size();
    bool fits = shape.size() <= rank;
    const std::size_t lead = fits ? rank - shape.size() : 0;
    std::vector<std::size_t> axes;
    for (std::size_t d = 0; fits && d < rank; ++d) {
        if (d < lead) {
            axes.push_back(d);
        } else if (shape[d - lead] != from[d]) {
            fits = shape[d - lead] == 1;
            axes.push_back(d);
        }
    }
    if (!fits) {
        SCALIFY_THROW(shape_error(fmt::format("vjp: operand shape {} does not broadcast to the cotangent's shape {}",
                                              shape_string(shape), shape_string(from))));
    }
    return axes;
}

/// g summed over `axes` (broadcast_axes of g and `shape`) and reshaped to `shape`.
template <class Strategy, class Op, class T, class P, class Shape>
[[nodiscard]] ScaledArray<T, P> summed_to(const ScaledArray<T, P>& g, std::vector<std::size_t> axes, const Shape& shape)
{
    using C = compute_t<T>;
    auto summed = reduce<Op, Strategy, T>("vjp", g, std::move(axes), C(0), sum_fn{});
    return reshape(summed, std::vector<std::size_t>(shape.begin(), shape.end()));
}
/// g summed over the axes that broadcasting added or stretched, so it has `shape`, stored under
/// Op's rule (contraction: the elements summed per output). shape_error if `shape` does not
/// broadcast to g's shape. Where nothing is summed the result is g: copied from an lvalue,
/// moved from an rvalue (a residual add's cotangent passes through without a copy).
template <class Strategy, class Op = ops::reduce_sum, class T, class P, class Shape>
[[nodiscard]] ScaledArray<T, P> unbroadcast(const ScaledArray<T, P>& g, const Shape& shape)
{
    auto axes = broadcast_axes(g.shape(), shape);
    if (axes.empty()) return g;
    return summed_to<Strategy, Op>(g, std::move(axes), shape);
}
template <class Strategy, class Op = ops::reduce_sum, class T, class P, class Shape>
[[nodiscard]] ScaledArray<T, P> unbroadcast(ScaledArray<T, P>&& g, const Shape& shape)
{
    auto axes = broadcast_axes(g.shape(), shape);
    if (axes.empty()) return std::move(g);
    return summed_to<Strategy, Op>(g, std::move(axes), shape);
}

}  // namespace detail

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

}  // namespace scalify
