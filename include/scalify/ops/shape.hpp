#pragma once
/// \file shape.hpp
/// Layout ops: transpose, reshape, rows / slice / split (copies, bounds checked), concatenate. Values are
/// unchanged; transpose, reshape and slicing keep the scale; concatenate's natural scale is the
/// largest of its parts' (the others rescale into it, exactly under pow2_scale barring
/// underflow), and its request's input scale is the parts' scales combined as an RMS over their
/// elements, which unit_scaling uses.

#include <scalify/ops/result.hpp>

#include <fmt/format.h>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <span>
#include <type_traits>
#include <vector>

namespace scalify {

namespace detail {

/// out[r * out_row + c] = in[r + c * in_col] for r < rows, c < cols, 32 x 32 tiles at a time:
/// a transpose with both sides in cache (an element-wise strided walk costs several times more).
template <class T>
void transpose_tiles(const T* in, std::size_t in_col, T* out, std::size_t out_row, std::size_t rows, std::size_t cols)
{
    constexpr std::size_t tile = 32;
    for (std::size_t r0 = 0; r0 < rows; r0 += tile) {
        const std::size_t r1 = std::min(rows, r0 + tile);
        for (std::size_t c0 = 0; c0 < cols; c0 += tile) {
            const std::size_t c1 = std::min(cols, c0 + tile);
            for (std::size_t r = r0; r < r1; ++r)
                for (std::size_t c = c0; c < c1; ++c) out[r * out_row + c] = in[r + c * in_col];
        }
    }
}

/// n elements from `in` to `out` (not overlapping). Short runs (a head's 32 floats of a split or
/// merge of attention heads, thousands of them per array) are copied in 64-byte pieces of fixed
/// size, which the compiler inlines as vector moves: a call of memmove per run cost more than the
/// copying it did (1.8 % of a char_lm step).
template <class T>
inline void copy_run(const T* in, std::size_t n, T* out) noexcept
{
    if constexpr (std::is_trivially_copyable_v<T> && sizeof(T) <= 64 && 64 % sizeof(T) == 0) {
        constexpr std::size_t piece = 64 / sizeof(T);
        if (n >= 16 * piece) {  // long runs: the library's memcpy
            std::memcpy(static_cast<void*>(out), static_cast<const void*>(in), n * sizeof(T));
            return;
        }
        std::size_t i = 0;
        for (; i + piece <= n; i += piece) std::memcpy(static_cast<void*>(out + i), static_cast<const void*>(in + i), 64);
        for (; i < n; ++i) out[i] = in[i];
    } else {
        std::copy_n(in, n, out);
    }
}

/// The transpose of a row-major (rows x cols) matrix held in `data` (its shape may have more axes:
/// matmul_extents reads them as rows).
template <class T>
[[nodiscard]] xt::xarray<T> transposed_copy(const xt::xarray<T>& data, std::size_t rows, std::size_t cols)
{
    auto out = xt::xarray<T>::from_shape({cols, rows});
    transpose_tiles(data.data(), cols, out.data(), rows, cols, rows);
    return out;
}
/// The transpose of a row-major 2-D array.
template <class T>
[[nodiscard]] xt::xarray<T> transposed_copy(const xt::xarray<T>& data)
{
    return transposed_copy(data, data.shape()[0], data.shape()[1]);
}

/// A row-major array with its axes permuted (result axis i is input axis perm[i]), written in
/// the result's order: runs of the axes both keep innermost are copied whole, and where the
/// input's innermost axis moves, each (that axis, the result's innermost axis) plane is a tiled
/// transpose. xtensor's generic strided assignment of xt::transpose walks one element at a time
/// through an index stepper (12 % of a char_lm step on its head splits and k^T).
template <class T>
[[nodiscard]] xt::xarray<T> permuted_copy(const xt::xarray<T>& data, const std::vector<std::size_t>& perm)
{
    const std::size_t rank = perm.size();
    std::vector<std::size_t> in_stride(rank, 1), shape(rank), out_stride(rank, 1);
    for (std::size_t d = rank; d-- > 1;) in_stride[d - 1] = in_stride[d] * data.shape()[d];
    for (std::size_t d = 0; d < rank; ++d) shape[d] = data.shape()[perm[d]];
    for (std::size_t d = rank; d-- > 1;) out_stride[d - 1] = out_stride[d] * shape[d];
    auto out = xt::xarray<T>::from_shape(shape);
    if (out.size() == 0) return out;
    if (rank == 0) {
        out.data()[0] = data.data()[0];
        return out;
    }
    // The innermost axes the permutation leaves in place form one contiguous run.
    std::size_t kept = rank, run = 1;
    while (kept > 0 && perm[kept - 1] == kept - 1) run *= shape[--kept];
    // Otherwise the plane spanned by the result's innermost axis and the input's innermost axis.
    std::size_t plane_axis = rank;
    if (kept == rank) {
        for (std::size_t d = 0; d < rank; ++d)
            if (perm[d] == rank - 1) plane_axis = d;
    }
    // The odometer walks the result's other axes: those outside the run, or outside the plane.
    const std::size_t walked = kept < rank ? kept : rank - 1;
    std::vector<std::size_t> outer;
    for (std::size_t d = 0; d < walked; ++d)
        if (d != plane_axis) outer.push_back(d);
    std::vector<std::size_t> index(outer.size(), 0);
    std::size_t in_offset = 0, out_offset = 0;
    const T* in = data.data();
    T* o = out.data();
    for (;;) {
        if (kept < rank) {
            copy_run(in + in_offset, run, o + out_offset);
        } else {
            transpose_tiles(in + in_offset, in_stride[perm[rank - 1]], o + out_offset, out_stride[plane_axis],
                            shape[plane_axis], shape[rank - 1]);
        }
        std::size_t a = outer.size();
        for (; a > 0; --a) {
            const std::size_t d = outer[a - 1];
            in_offset += in_stride[perm[d]];
            out_offset += out_stride[d];
            if (++index[a - 1] < shape[d]) break;
            in_offset -= in_stride[perm[d]] * shape[d];
            out_offset -= out_stride[d] * shape[d];
            index[a - 1] = 0;
        }
        if (a == 0) return out;
    }
}

}  // namespace detail

/// Axes reversed (for 2-D: the matrix transpose).
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> transpose(const ScaledArray<T, P>& a)
{
    if (a.dimension() == 2) return ScaledArray<T, P>(detail::transposed_copy(a.data()), a.scale());
    std::vector<std::size_t> reversed(a.dimension());
    for (std::size_t d = 0; d < reversed.size(); ++d) reversed[d] = reversed.size() - 1 - d;
    return ScaledArray<T, P>(detail::permuted_copy(a.data(), reversed), a.scale());
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
    return ScaledArray<T, P>(detail::permuted_copy(a.data(), perm), a.scale());
}

/// Same elements in row-major order under a new shape of the same size (shape_error otherwise).
/// An rvalue array gives up its memory: no copy (the backward pass's cotangents).
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> reshape(ScaledArray<T, P>&& a, std::vector<std::size_t> shape)
{
    if (detail::element_count(shape) != a.size()) {
        SCALIFY_THROW(shape_error(fmt::format("reshape: cannot reshape {} ({} elements) to {}", shape_string(a.shape()),
                                              a.size(), shape_string(shape))));
    }
    const float scale = a.scale();
    xt::xarray<T> data = std::move(a).release_data();
    data.reshape(shape);
    return ScaledArray<T, P>(std::move(data), scale);
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> reshape(const ScaledArray<T, P>& a, std::vector<std::size_t> shape)
{
    return reshape(ScaledArray<T, P>(a), std::move(shape));
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
    // outer blocks of (last - first) x inner contiguous elements (xtensor's strided view copied
    // one element at a time: 1.3 % of a char_lm step on the heads' split)
    std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
    std::size_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= shape[d];
    for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
    const std::size_t row = shape[axis] * inner, width = (last - first) * inner;
    shape[axis] = last - first;
    auto data = xt::xarray<T>::from_shape(shape);
    const T* in = a.data().data() + first * inner;
    T* out = data.data();
    for (std::size_t o = 0; o < outer; ++o) detail::copy_run(in + o * row, width, out + o * width);
    return ScaledArray<T, P>(std::move(data), a.scale());
}

namespace detail {

template <class T, class P>
[[nodiscard]] std::vector<ScaledArray<T, P>> split_along(const char* op, const ScaledArray<T, P>& a,
                                                         const std::vector<std::size_t>& extents, std::size_t axis)
{
    std::size_t total = 0;
    for (auto extent : extents) total += extent;
    if (axis >= a.dimension() || total != a.shape()[axis]) {
        SCALIFY_THROW(shape_error(fmt::format("{}: part extents {} along axis {} do not make up shape {}", op,
                                              shape_string(extents), axis, shape_string(a.shape()))));
    }
    std::vector<ScaledArray<T, P>> parts;
    parts.reserve(extents.size());
    std::size_t first = 0;
    for (auto extent : extents) {
        parts.push_back(slice(a, axis, first, first + extent));
        first += extent;
    }
    return parts;
}

/// `sections` equal extents making up `extent`; shape_error naming the op otherwise.
[[nodiscard]] inline std::vector<std::size_t> equal_sections(const char* op, std::size_t extent, std::size_t sections,
                                                              std::size_t axis)
{
    if (sections == 0 || extent % sections != 0) {
        SCALIFY_THROW(shape_error(fmt::format("{}: {} equal sections do not divide extent {} of axis {}", op, sections, extent, axis)));
    }
    return std::vector<std::size_t>(sections, extent / sections);
}

}  // namespace detail

/// a cut along `axis` into parts of `extents` elements (they must add up to a's extent: shape_error
/// otherwise), each a new array with a's scale: numpy.split / torch.split.
template <class T, class P>
[[nodiscard]] std::vector<ScaledArray<T, P>> split(const ScaledArray<T, P>& a, const std::vector<std::size_t>& extents,
                                                   std::size_t axis = 0)
{
    return detail::split_along("split", a, extents, axis);
}

/// a cut along `axis` into `sections` parts of equal extent (shape_error unless they divide it).
template <class T, class P>
[[nodiscard]] std::vector<ScaledArray<T, P>> split(const ScaledArray<T, P>& a, std::size_t sections, std::size_t axis = 0)
{
    if (axis >= a.dimension()) {
        SCALIFY_THROW(shape_error(fmt::format("split: axis {} out of range for shape {}", axis, shape_string(a.shape()))));
    }
    return detail::split_along("split", a, detail::equal_sections("split", a.shape()[axis], sections, axis), axis);
}

/// Rows [first, last) of an array (slice along axis 0): a mini-batch.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> rows(const ScaledArray<T, P>& a, std::size_t first, std::size_t last)
{
    return slice(a, 0, first, last);
}

namespace detail {
/// concatenate over a span of parts, so that a braced list is read where it is (not copied into
/// a vector first).
template <class Strategy, class T, class P>
[[nodiscard]] ScaledArray<T, P> concatenate_parts(std::span<const ScaledArray<T, P>> parts, std::size_t axis)
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
    scale_request request;
    request.natural = natural;
    // The parts as one input: the RMS of their scales over the elements (unit data in every part
    // give a result of that RMS value).
    const std::size_t total = detail::element_count(shape);
    request.input_scales[0] = total == 0 ? natural : static_cast<float>(std::sqrt(sum_squared_scales / double(total)));
    // Each part's element rescaled into the common scale (rounded), then stored as finish stores
    // it; `place(part, raw element, out)` writes one part's block of every outer slab.
    const auto join = [&](auto place) {
        std::size_t offset = 0;  // along axis, in elements of one outer slab
        const std::size_t slab = shape[axis] * inner;
        for (const auto& part : parts) {
            const std::size_t block = part.shape()[axis] * inner;
            const auto k = detail::make_factor<C>(natural == 0.0f ? 0.0 : double(part.scale()) / natural);
            const T* in = part.data().data();
            for (std::size_t o = 0; o < outer; ++o) place(in + o * block, block, k, o * slab + offset);
            offset += block;
        }
    };
    if constexpr (!detail::needs_amax_v<Strategy>) {
        // A static scale: stored straight from the parts, no buffer of raw values.
        const float scale = detail::checked_output_scale<P>(detail::rule_for<ops::concatenate, Strategy, P>()(request), "concatenate",
                                                            request);
        xt::xarray<T> data = xt::xarray<T>::from_shape(shape);
        T* out = data.data();
        if (scale == 0.0f || natural == 0.0f) {
            std::fill_n(out, total, detail::store<T>(C(0)));
        } else {
            const auto factor = detail::make_factor<C>(static_cast<double>(natural) / static_cast<double>(scale));
            join([&](const T* in, std::size_t block, detail::scale_factor<C> k, std::size_t at) {
                for (std::size_t j = 0; j < block; ++j) out[at + j] = detail::store<T>(factor.apply(detail::scaled_load(in[j], k)));
            });
        }
        ScaledArray<T, P> result(std::move(data), natural == 0.0f ? 0.0f : scale);
        detail::check_output("concatenate", result);
        return result;
    } else {
        // The raw values in a per-thread buffer (a fresh one cost its page faults per call).
        C* const raw = detail::scratch<C, ops::concatenate>(total);
        join([raw](const T* in, std::size_t block, detail::scale_factor<C> k, std::size_t at) {
            for (std::size_t j = 0; j < block; ++j) raw[at + j] = detail::scaled_load(in[j], k);
        });
        return detail::finish<ops::concatenate, Strategy, P, T, C>("concatenate", shape, request, detail::buffer_source<C>{raw});
    }
}
}  // namespace detail

/// Parts joined along `axis`; all other extents must agree (shape_error otherwise). The result
/// has the parts' largest scale under default_scaling, their RMS scale over the elements under
/// unit_scaling.
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> concatenate(const std::vector<ScaledArray<T, P>>& parts, std::size_t axis = 0)
{
    return detail::concatenate_parts<Strategy, T, P>(parts, axis);
}

/// concatenate({a, b, c}, axis).
template <class Strategy = default_scaling, class T, class P>
[[nodiscard]] ScaledArray<T, P> concatenate(std::initializer_list<ScaledArray<T, P>> parts, std::size_t axis = 0)
{
    return detail::concatenate_parts<Strategy, T, P>(std::span<const ScaledArray<T, P>>(parts.begin(), parts.size()), axis);
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
/// reshape_vjp of a cotangent the caller gives up: its memory, no copy.
template <class G, class P, class Shape>
[[nodiscard]] ScaledArray<G, P> reshape_vjp(ScaledArray<G, P>&& g, const Shape& shape)
{
    return reshape(std::move(g), std::vector<std::size_t>(shape.begin(), shape.end()));
}

/// y = concatenate(parts, axis), given each part's extent along `axis`: g cut back into the
/// parts' pieces (split). shape_error unless the extents add up to g's extent along `axis`.
template <class G, class P>
[[nodiscard]] std::vector<ScaledArray<G, P>> concatenate_vjp(const ScaledArray<G, P>& g, const std::vector<std::size_t>& extents,
                                                             std::size_t axis)
{
    return detail::split_along("concatenate_vjp", g, extents, axis);
}

}  // namespace scalify
