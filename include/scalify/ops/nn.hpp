#pragma once
/// \file nn.hpp
/// softmax along an axis: computed on the value in compute_t with the max subtracted, so no
/// input scale can overflow it; the output lies in [0, 1], natural scale 1.

#include <scalify/ops/reduce.hpp>

#include <cmath>
#include <vector>

namespace scalify {

template <class Strategy = default_scaling, class Out = void, class T, class P>
[[nodiscard]] auto softmax(const ScaledArray<T, P>& a, std::size_t axis)
{
    using C = compute_t<T>;
    const auto& shape = a.shape();
    if (axis >= shape.size()) {
        SCALIFY_THROW(shape_error(fmt::format("softmax: axis {} out of range for shape {}", axis, shape_string(shape))));
    }
    std::size_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= shape[d];
    for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
    const std::size_t length = shape[axis];
    const C s = static_cast<C>(a.scale());
    const T* data = a.data().data();
    std::vector<C> raw(a.size());
    const auto value = [&](std::size_t i) { return s == C(0) ? C(0) : detail::load(data[i]) * s; };  // zero scale: zeros
    for (std::size_t o = 0; o < outer; ++o) {
        for (std::size_t j = 0; j < inner; ++j) {
            const std::size_t base = o * length * inner + j;
            C top = -std::numeric_limits<C>::infinity();
            for (std::size_t k = 0; k < length; ++k) {
                const C v = value(base + k * inner);
                top = (top != top || top > v) ? top : v;
            }
            C total = 0;
            for (std::size_t k = 0; k < length; ++k) {
                const C e = std::exp(value(base + k * inner) - top);
                raw[base + k * inner] = e;
                total += e;
            }
            for (std::size_t k = 0; k < length; ++k) raw[base + k * inner] /= total;
        }
    }
    scale_request request;
    request.natural = 1.0f;
    request.input_scales[0] = a.scale();
    return detail::finish<ops::softmax, Strategy, P, detail::out_or_t<Out, T>, C>(
        "softmax", shape, request, [&raw](std::size_t i) { return raw[i]; });
}

}  // namespace scalify
