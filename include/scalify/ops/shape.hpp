#pragma once
/// \file shape.hpp
/// Layout ops: transpose, reshape, rows / slice (copies, bounds checked), concatenate. Values are
/// unchanged; transpose, reshape and slicing keep the scale; concatenate's natural scale is the
/// largest of its parts' (the others rescale into it, exactly under pow2_scale barring
/// underflow), and its request's input scale is the parts' scales combined as an RMS over their
/// elements, which unit_scaling uses.

#include <scalify/ops/result.hpp>

#include <fmt/format.h>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <vector>

namespace scalify {

namespace detail {

/// The transpose of a row-major 2-D array, copied tile by tile (both sides stay in cache; an
/// element-wise strided assignment costs several times more).
template <class T>
[[nodiscard]] xt::xarray<T> transposed_copy(const xt::xarray<T>& data)
{
    constexpr std::size_t tile = 32;
    const std::size_t rows = data.shape()[0], cols = data.shape()[1];
    auto out = xt::xarray<T>::from_shape({cols, rows});
    const T* in = data.data();
    T* o = out.data();
    for (std::size_t r0 = 0; r0 < rows; r0 += tile) {
        const std::size_t r1 = std::min(rows, r0 + tile);
        for (std::size_t c0 = 0; c0 < cols; c0 += tile) {
            const std::size_t c1 = std::min(cols, c0 + tile);
            for (std::size_t r = r0; r < r1; ++r)
                for (std::size_t c = c0; c < c1; ++c) o[c * rows + r] = in[r * cols + c];
        }
    }
    return out;
}

}  // namespace detail

/// Axes reversed (for 2-D: the matrix transpose).
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> transpose(const ScaledArray<T, P>& a)
{
    if (a.dimension() == 2) return ScaledArray<T, P>(detail::transposed_copy(a.data()), a.scale());
    return ScaledArray<T, P>(xt::xarray<T>(xt::transpose(a.data())), a.scale());
}

/// Axes permuted: result axis i is input axis perm[i]. shape_error unless perm is a permutation.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> transpose(const ScaledArray<T, P>& a, std::vector<std::size_t> perm)
{
    std::vector<std::size_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i) {
        if (sorted.size() != a.dimension() || sorted[i] != i) {
            SCALIFY_THROW(shape_error(fmt::format("transpose: {} is not a permutation of the axes of shape {}",
                                                  shape_string(perm), shape_string(a.shape()))));
        }
    }
    if (sorted.size() != a.dimension()) {
        SCALIFY_THROW(shape_error(fmt::format("transpose: {} is not a permutation of the axes of shape {}",
                                              shape_string(perm), shape_string(a.shape()))));
    }
    return ScaledArray<T, P>(xt::xarray<T>(xt::transpose(a.data(), perm)), a.scale());
}

/// Same elements in row-major order under a new shape of the same size (shape_error otherwise).
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> reshape(const ScaledArray<T, P>& a, std::vector<std::size_t> shape)
{
    if (detail::element_count(shape) != a.size()) {
        SCALIFY_THROW(shape_error(fmt::format("reshape: cannot reshape {} ({} elements) to {}", shape_string(a.shape()),
                                              a.size(), shape_string(shape))));
    }
    xt::xarray<T> data = a.data();
    data.reshape(shape);
    return ScaledArray<T, P>(std::move(data), a.scale());
}

/// Elements [first, last) along `axis`, as a new array. shape_error unless first <= last <= extent.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> slice(const ScaledArray<T, P>& a, std::size_t axis, std::size_t first, std::size_t last)
{
    if (axis >= a.dimension() || first > last || last > a.shape()[axis]) {
        SCALIFY_THROW(shape_error(fmt::format("slice: [{}, {}) along axis {} is outside shape {}", first, last, axis,
                                              shape_string(a.shape()))));
    }
    if (a.size() == 0 || first == last) {
        // xtensor's strided view offsets the (null) data pointer of an empty array: build directly.
        std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
        shape[axis] = last - first;
        return ScaledArray<T, P>(xt::xarray<T>::from_shape(shape), a.scale());
    }
    xt::xstrided_slice_vector slices(a.dimension(), xt::all());
    slices[axis] = xt::range(first, last);
    return ScaledArray<T, P>(xt::xarray<T>(xt::strided_view(a.data(), slices)), a.scale());
}

/// Rows [first, last) of an array (slice along axis 0): a mini-batch.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> rows(const ScaledArray<T, P>& a, std::size_t first, std::size_t last)
{
    return slice(a, 0, first, last);
}

/// Parts joined along `axis`; all other extents must agree (shape_error otherwise). The result
/// has the parts' largest scale under default_scaling, their RMS scale over the elements under
/// unit_scaling.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> concatenate(const std::vector<ScaledArray<T, P>>& parts, std::size_t axis = 0)
{
    if (parts.empty()) SCALIFY_THROW(shape_error("concatenate: no arrays given"));
    const auto& first = parts.front().shape();
    if (axis >= first.size()) {
        SCALIFY_THROW(shape_error(fmt::format("concatenate: axis {} out of range for shape {}", axis, shape_string(first))));
    }
    std::vector<std::size_t> shape(first.begin(), first.end());
    shape[axis] = 0;
    float natural = 0.0f;
    double sum_squared_scales = 0.0;  // each part's scale^2 weighted by its size
    for (const auto& part : parts) {
        const auto& s = part.shape();
        bool fits = s.size() == first.size();
        for (std::size_t d = 0; fits && d < s.size(); ++d) fits = d == axis || s[d] == first[d];
        if (!fits) {
            SCALIFY_THROW(shape_error(fmt::format("concatenate: shape {} does not join {} along axis {}",
                                                  shape_string(s), shape_string(first), axis)));
        }
        shape[axis] += s[axis];
        natural = std::max(natural, part.scale());
        sum_squared_scales += static_cast<double>(part.size()) * part.scale() * part.scale();
    }
    std::size_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= shape[d];
    for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];

    using C = compute_t<T>;
    std::vector<C> raw(detail::element_count(shape));
    std::size_t offset = 0;  // along axis, in elements of one outer slab
    const std::size_t slab = shape[axis] * inner;
    for (const auto& part : parts) {
        const std::size_t block = part.shape()[axis] * inner;
        const auto k = detail::make_factor<C>(natural == 0.0f ? 0.0 : double(part.scale()) / natural);
        const T* in = part.data().data();
        for (std::size_t o = 0; o < outer; ++o) {
            for (std::size_t j = 0; j < block; ++j) raw[o * slab + offset + j] = detail::scaled_load(in[o * block + j], k);
        }
        offset += block;
    }
    scale_request request;
    request.natural = natural;
    // The parts as one input: the RMS of their scales over the elements (unit data in every part
    // give a result of that RMS value).
    const std::size_t total = detail::element_count(shape);
    request.input_scales[0] = total == 0 ? natural : static_cast<float>(std::sqrt(sum_squared_scales / double(total)));
    return detail::finish<ops::concatenate, Strategy, P, T, C>("concatenate", shape, request,
                                                              [&raw](std::size_t i) { return raw[i]; });
}

/// concatenate({a, b, c}, axis).
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> concatenate(std::initializer_list<ScaledArray<T, P>> parts, std::size_t axis = 0)
{
    return concatenate<Strategy>(std::vector<ScaledArray<T, P>>(parts), axis);
}

// ---- backward rules -------------------------------------------------------------------------

namespace detail {

/// a with its last two axes swapped (a copy).
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> swap_last_axes(const ScaledArray<T, P>& a)
{
    std::vector<std::size_t> perm(a.dimension());
    for (std::size_t d = 0; d < perm.size(); ++d) perm[d] = d;
    std::swap(perm[perm.size() - 2], perm[perm.size() - 1]);
    return transpose(a, std::move(perm));
}

}  // namespace detail

// ---- layout -----------------------------------------------------------------------------------

/// y = transpose(x): transpose(g). y = reshape(x, ...): g reshaped to x's shape.
template <class G, class P>
[[nodiscard]] ScaledArray<G, P> transpose_vjp(const ScaledArray<G, P>& g)
{
    return transpose(g);
}
template <class G, class P, class Shape>
[[nodiscard]] ScaledArray<G, P> reshape_vjp(const ScaledArray<G, P>& g, const Shape& shape)
{
    return reshape(g, std::vector<std::size_t>(shape.begin(), shape.end()));
}

/// y = concatenate(parts, axis), given each part's extent along `axis`: g cut back into the
/// parts' pieces, each a slice of g (data and scale kept). shape_error unless the extents add up
/// to g's extent along `axis`.
template <class G, class P>
[[nodiscard]] std::vector<ScaledArray<G, P>> concatenate_vjp(const ScaledArray<G, P>& g, const std::vector<std::size_t>& extents,
                                                             std::size_t axis)
{
    std::size_t total = 0;
    for (auto extent : extents) total += extent;
    if (axis >= g.dimension() || total != g.shape()[axis]) {
        SCALIFY_THROW(shape_error(fmt::format("concatenate_vjp: part extents {} along axis {} do not make up the cotangent's shape {}",
                                              shape_string(extents), axis, shape_string(g.shape()))));
    }
    std::vector<ScaledArray<G, P>> parts;
    parts.reserve(extents.size());
    std::size_t first = 0;
    for (auto extent : extents) {
        parts.push_back(slice(g, axis, first, first + extent));
        first += extent;
    }
    return parts;
}

}  // namespace scalify
