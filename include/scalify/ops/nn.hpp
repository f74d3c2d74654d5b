#pragma once
/// \file nn.hpp
/// softmax and log_softmax along an axis, computed on the value in compute_t with the max
/// subtracted, so no input scale can overflow them. softmax's output lies in [0, 1] and
/// log_softmax's in (-inf, 0]: natural scale 1 for both. Their rules see the axis length
/// (scale_request::axis_length) and the input scale.
///
///     auto p = softmax<unit_scaling>(logits, 1);      // data ~ unit RMS for unit-normal logits
///     auto lp = log_softmax<unit_scaling>(logits, 1);

#include <scalify/ops/reduce.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
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

    /// f(base, stride) for every lane.
    template <class F>
    void for_each(F f) const
    {
        for (std::size_t o = 0; o < outer; ++o) {
            for (std::size_t j = 0; j < inner; ++j) f(o * length * inner + j, inner);
        }
    }
};

/// Per lane of the value: its max and total = sum exp(v - max), then raw[i] =
/// finish_lane(v_i, max, total, log(total)) for each element.
template <class Op, class Strategy, class Out, class T, class P, class Finish>
[[nodiscard]] auto normalise_along(const char* op, const ScaledArray<T, P>& a, std::size_t axis, Finish finish_lane)
{
    using C = compute_t<T>;
    const axis_lanes lanes(op, a.shape(), axis);
    const C s = static_cast<C>(a.scale());
    const T* data = a.data().data();
    const auto value = [&](std::size_t i) { return s == C(0) ? C(0) : load(data[i]) * s; };  // zero scale: zeros
    std::vector<C> raw(a.size());
    lanes.for_each([&](std::size_t base, std::size_t stride) {
        C top = -std::numeric_limits<C>::infinity();
        for (std::size_t k = 0; k < lanes.length; ++k) {
            const C v = value(base + k * stride);
            top = (top != top || top > v) ? top : v;
        }
        C total = 0;
        for (std::size_t k = 0; k < lanes.length; ++k) total += std::exp(value(base + k * stride) - top);
        const C log_total = std::log(total);
        for (std::size_t k = 0; k < lanes.length; ++k) {
            raw[base + k * stride] = finish_lane(value(base + k * stride), top, total, log_total);
        }
    });
    scale_request request;
    request.natural = 1.0f;
    request.input_scales[0] = a.scale();
    request.axis_length = lanes.length;
    return finish<Op, Strategy, P, out_or_t<Out, T>, C>(op, a.shape(), request, [&raw](std::size_t i) { return raw[i]; });
}

}  // namespace detail

/// exp(a - logsumexp(a)) along `axis`. Natural scale 1; unit_scaling: the expected RMS of a
/// softmax of unit-normal logits at the input's scale (1.65 / L for scale 1 and large L).
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto softmax(const ScaledArray<T, P>& a, std::size_t axis)
{
    return detail::normalise_along<ops::softmax, Strategy, Out>(
        "softmax", a, axis, [](auto v, auto top, auto total, auto) { return std::exp(v - top) / total; });
}

/// a - logsumexp(a) along `axis`. Natural scale 1; unit_scaling: the expected RMS of the result
/// for unit-normal logits (about log L + sigma^2 / 2 for large L: the mean dominates).
template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto log_softmax(const ScaledArray<T, P>& a, std::size_t axis)
{
    return detail::normalise_along<ops::log_softmax, Strategy, Out>(
        "log_softmax", a, axis, [](auto v, auto top, auto, auto log_total) { return (v - top) - log_total; });
}

}  // namespace scalify
