#pragma once
/// \file sequence.hpp
/// The ops a sequence model adds to an MLP, and their backward rules: embedding (rows of a
/// table gathered by integer ids; the gradient scatter-adds the cotangent's rows back) and
/// causal_mask (the scores of future positions set to -inf before a softmax).
///
///     auto x = embedding(table, ids);           // (V, D) table, ids (B, T) -> (B, T, D)
///     auto s = causal_mask(scores);             // (..., T, T): entry (i, j) = -inf where j > i
///
/// Both move or hide values without computing new ones, so both keep their input's scale, under
/// every strategy (as transpose and slice do). The masked entries of causal_mask hold -inf data,
/// which is -inf at any positive scale: a softmax gives them exactly 0 and the scale of the
/// unmasked entries is untouched. Amax-based strategies see an infinite amax in masked scores
/// and fall back to the natural scale, so masked scores should go straight to softmax (as
/// attention does). A zero-scale input is zeros: its result gets scale 1 (zero data, -inf where
/// masked), which keeps the mask.

#include <scalify/error.hpp>
#include <scalify/ops/result.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/scaling.hpp>

#include <fmt/format.h>
#include <xtensor/xarray.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <limits>
#include <vector>

namespace scalify {

namespace detail {

/// index_error naming the first id outside [0, rows) and its position.
template <std::integral I>
void check_ids(const char* op, const xt::xarray<I>& ids, std::size_t rows)
{
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const I id = ids.data()[i];
        if (id < 0 || static_cast<std::size_t>(id) >= rows) {
            SCALIFY_THROW(index_error(fmt::format("{}: id {} at position {} is outside the table's {} rows", op,
                                                  static_cast<long long>(id), i, rows)));
        }
    }
}

/// Checks a gather: `table` is (V, D) and every id in [0, V); shape_error / index_error naming
/// the values otherwise.
template <class T, class P, std::integral I>
void check_embedding(const char* op, const ScaledArray<T, P>& table, const xt::xarray<I>& ids)
{
    if (table.dimension() != 2) {
        SCALIFY_THROW(shape_error(fmt::format("{}: the table must be 2-D (rows, features), got shape {}", op,
                                              shape_string(table.shape()))));
    }
    check_ids(op, ids, table.shape()[0]);
}

/// Row-major lanes of the last two axes (T_q, T_k): whether entry i of such an array is masked.
struct causal_layout {
    std::size_t queries = 0, keys = 0;

    template <class Shape>
    causal_layout(const char* op, const Shape& shape)
    {
        if (shape.size() < 2) {
            SCALIFY_THROW(shape_error(fmt::format("{}: needs (..., queries, keys) scores, got shape {}", op, shape_string(shape))));
        }
        queries = shape[shape.size() - 2];
        keys = shape[shape.size() - 1];
    }
    /// PyTorch's is_causal alignment (top left): query i sees keys 0..i. f(first, last) is called
    /// for each row's masked run [first, last) of flat indices, row by row (no division per
    /// element: the index arithmetic was most of the mask's cost).
    template <class F>
    void for_each_masked_run(std::size_t size, F&& f) const
    {
        if (keys == 0 || queries == 0) return;
        for (std::size_t row = 0, first = 0; first < size; ++row, first += keys) {
            const std::size_t seen = std::min(keys, row % queries + 1);
            if (seen < keys) f(first + seen, first + keys);
        }
    }
};

}  // namespace detail

/// The rows table[ids] of a (V, D) table: shape ids.shape() + (D), the table's type and scale.
template <class T, class P, std::integral I>
[[nodiscard]] ScaledArray<T, P> embedding(const ScaledArray<T, P>& table, const xt::xarray<I>& ids)
{
    detail::check_embedding("embedding", table, ids);
    const std::size_t width = table.shape()[1];
    std::vector<std::size_t> shape(ids.shape().begin(), ids.shape().end());
    shape.push_back(width);
    xt::xarray<T> data = xt::xarray<T>::from_shape(shape);
    const T* rows = table.data().data();
    for (std::size_t i = 0; i < ids.size(); ++i) {
        std::copy_n(rows + static_cast<std::size_t>(ids.data()[i]) * width, width, data.data() + i * width);
    }
    return ScaledArray<T, P>(std::move(data), table.scale());
}

namespace detail {

/// embedding_vjp's result as a row-by-row element source: a looked-up row's sums, zeros for every
/// other row (a named type: the store loop is compiled once per compute type, whatever the
/// strategy and the ids' type).
template <class C>
struct embedding_rows {
    static constexpr std::size_t untouched = std::numeric_limits<std::size_t>::max();
    const C* sums;            ///< the looked-up rows' sums, `width` each, in order of first lookup
    const std::size_t* slot;  ///< per table row: its index among the looked-up rows, or untouched
    std::size_t width;
    [[nodiscard]] C operator()(std::size_t, std::size_t j, std::size_t row) const noexcept
    {
        const std::size_t s = slot[row];
        return s == untouched ? C(0) : sums[s * width + j];
    }
};

}  // namespace detail

/// Gradient of embedding(table, ids) with respect to a table of `rows` rows: the cotangent's
/// rows added into a zero (rows, D) array in id order (sums in compute_t, so the result does not
/// depend on threads), stored under ops::vjp<ops::embedding> (natural scale: g's; unit_scaling
/// adds sqrt(lookups / rows), docs/ops.md). Only the rows the ids name are summed (in per-thread
/// buffers): a large vocabulary's other rows cost their store of zeros alone.
template <class Strategy = default_scaling, class Out = void, class G, class P, std::integral I>
[[nodiscard]] auto embedding_vjp(const ScaledArray<G, P>& g, const xt::xarray<I>& ids, std::size_t rows)
{
    using C = compute_t<G>;
    using source = detail::embedding_rows<C>;
    const std::size_t width = g.dimension() == 0 ? 0 : g.shape()[g.dimension() - 1];
    if (g.dimension() != ids.dimension() + 1 || !std::equal(ids.shape().begin(), ids.shape().end(), g.shape().begin())) {
        SCALIFY_THROW(shape_error(fmt::format("embedding_vjp: cotangent shape {} does not match ids of shape {} plus a "
                                              "feature axis",
                                              shape_string(g.shape()), shape_string(ids.shape()))));
    }
    detail::check_ids("embedding_vjp", ids, rows);
    // One pass over the ids: a row's sum is zeroed where its id first appears (at most one per
    // lookup), then every lookup adds its row in id order.
    std::size_t* const slot = detail::scratch<std::size_t, ops::embedding>(rows);
    std::fill_n(slot, rows, source::untouched);
    C* const sums = detail::scratch<C, ops::embedding>(ids.size() * width);
    std::size_t looked_up = 0;
    const G* gd = g.data().data();
    for (std::size_t i = 0; i < ids.size(); ++i) {
        std::size_t& s = slot[static_cast<std::size_t>(ids.data()[i])];
        if (s == source::untouched) {
            s = looked_up++;
            std::fill_n(sums + s * width, width, C(0));
        }
        C* row = sums + s * width;
        for (std::size_t j = 0; j < width; ++j) row[j] += detail::load(gd[i * width + j]);
    }
    scale_request request;
    request.natural = g.scale();
    request.input_scales[0] = g.scale();
    request.contraction = ids.size();
    request.axis_length = std::max<std::size_t>(rows, 1);
    const std::vector<std::size_t> shape{rows, width};
    return detail::finish<ops::vjp<ops::embedding>, Strategy, P, detail::out_or_t<Out, G>, C>(
        "embedding_vjp", shape, request, detail::periodic_source<source>{{sums, slot, width}, std::max<std::size_t>(width, 1)});
}

/// Scores (..., T_q, T_k) with entry (i, j) set to -inf where j > i (PyTorch's is_causal): same
/// type and scale, the scale 1 for a zero-scale input (see the file comment). T needs an
/// infinity (float, double, half, bfloat16, float8_e5m2: not float8_e4m3fn). Expiring scores (an
/// rvalue) are masked in their own memory.
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> causal_mask(ScaledArray<T, P> scores)
{
    static_assert(std::numeric_limits<T>::has_infinity,
                  "causal_mask: the scores' type has no infinity to mask with (use float, half, bfloat16 or float8_e5m2)");
    const detail::causal_layout layout("causal_mask", scores.shape());
    const float scale = scores.scale();
    const bool zero_scale = scale == 0.0f;
    xt::xarray<T> data = std::move(scores).release_data();
    const T zero = detail::store<T>(compute_t<T>(0));
    if (zero_scale) std::fill_n(data.data(), data.size(), zero);
    layout.for_each_masked_run(data.size(), [&data](std::size_t first, std::size_t last) {
        std::fill(data.data() + first, data.data() + last, -std::numeric_limits<T>::infinity());
    });
    return ScaledArray<T, P>(std::move(data), zero_scale ? 1.0f : scale);
}

/// Gradient of causal_mask: the cotangent with the masked entries zeroed (same scale; in g's own
/// memory when g expires).
template <class G, class P>
[[nodiscard]] ScaledArray<G, P> causal_mask_vjp(ScaledArray<G, P> g)
{
    const detail::causal_layout layout("causal_mask_vjp", g.shape());
    const float scale = g.scale();
    xt::xarray<G> data = std::move(g).release_data();
    const G zero = detail::store<G>(compute_t<G>(0));
    layout.for_each_masked_run(data.size(), [&](std::size_t first, std::size_t last) {
        std::fill(data.data() + first, data.data() + last, zero);
    });
    return ScaledArray<G, P>(std::move(data), scale);
}

}  // namespace scalify
