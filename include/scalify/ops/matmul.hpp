#pragma once
/// \file matmul.hpp
/// matmul of 2-D ScaledArrays through Eigen's GEMM. Operands that are not float (minifloats,
/// half, bfloat16) are decoded whole into float panels first, then one sgemm accumulates in
/// float32 (double for double data); never element-by-element dot products. With a static
/// strategy the rescale natural/scale is GEMM's alpha, so a float x float matmul costs one
/// sgemm. Natural scale sa * sb; default_scaling multiplies it by sqrt(K).
///
///     auto y = matmul(x, w);                                  // data = x.w / sqrt(K)
///     auto z = matmul<dynamic_abs<float8_e4m3fn>, float8_e4m3fn>(x, w);

#include <scalify/ops/result.hpp>

#include <Eigen/Core>

#include <cstddef>
#include <type_traits>

namespace scalify {

namespace detail {

template <class C>
using row_major_matrix = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Operand as a row-major C matrix: a map over the data when T is C, else a decoded copy
/// (held in `panel`).
template <class C, class T>
[[nodiscard]] Eigen::Map<const row_major_matrix<C>> as_matrix(const xt::xarray<T>& data, row_major_matrix<C>& panel)
{
    const auto rows = static_cast<Eigen::Index>(data.shape()[0]);
    const auto cols = static_cast<Eigen::Index>(data.shape()[1]);
    if constexpr (std::same_as<T, C>) {
        return Eigen::Map<const row_major_matrix<C>>(data.data(), rows, cols);
    } else {
        if (panel.size() < rows * cols) panel.resize(rows * cols, 1);
        const T* in = data.data();
        C* out = panel.data();
        const std::size_t n = data.size();
        for (std::size_t i = 0; i < n; ++i) out[i] = load(in[i]);
        return Eigen::Map<const row_major_matrix<C>>(panel.data(), rows, cols);
    }
}

}  // namespace detail

namespace detail {
/// Sentinel: no buffer to reuse.
struct no_buffer {};
}  // namespace detail

/// a (M x K) times b (K x N). shape_error unless both are 2-D with matching inner dimensions.
/// The optional third argument is a buffer to write the result into (its memory is reused when it
/// already holds M x N elements), typically the data of the previous result:
///     c = matmul(a, b, std::move(c).release_data());   // no allocation in a loop
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB,
          class Buffer = detail::no_buffer>
[[nodiscard]] auto matmul(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, Buffer&& buffer = {})
{
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    using R = detail::out_or_t<Out, promote_t<A, B>>;
    using P = common_policy_t<PA, PB>;
    static_assert(ScalingStrategy<Strategy>, "the Strategy argument does not satisfy scalify::ScalingStrategy");
    if (a.dimension() != 2 || b.dimension() != 2 || a.shape()[1] != b.shape()[0]) {
        SCALIFY_THROW(shape_error(fmt::format("matmul: shapes {} and {} do not multiply (need (M, K) and (K, N))",
                                              shape_string(a.shape()), shape_string(b.shape()))));
    }
    const std::size_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
    // Decoded panels live in per-thread buffers that only grow: a fresh allocation per call costs
    // more in first-touch page faults than the decode itself.
    thread_local detail::row_major_matrix<C> a_panel, b_panel;
    const auto lhs = detail::as_matrix<C>(a.data(), a_panel);
    const auto rhs = detail::as_matrix<C>(b.data(), b_panel);

    scale_request request;
    request.natural = static_cast<float>(double(a.scale()) * b.scale());
    request.input_scales[0] = a.scale();
    request.input_scales[1] = b.scale();
    request.input_count = 2;
    request.contraction = k;
    const std::vector<std::size_t> shape{m, n};

    if constexpr (!Strategy::needs_amax && std::same_as<R, C>) {
        // Static scale: fold natural / scale into GEMM's alpha and write straight into the result.
        const float scale = detail::checked_output_scale<P>(
            scaling_traits<ops::matmul, Strategy>::template output_scale<P>(request), "matmul", request);
        xt::xarray<R> data;
        if constexpr (std::same_as<std::remove_cvref_t<Buffer>, xt::xarray<R>>) {
            data = std::move(buffer);
            if (data.size() == m * n) data.reshape({m, n});  // same memory
            else data = xt::xarray<R>::from_shape(shape);
        } else {
            static_assert(std::same_as<std::remove_cvref_t<Buffer>, detail::no_buffer>,
                          "matmul's buffer must be an xt::xarray of the result's element type");
            data = xt::xarray<R>::from_shape(shape);
        }
        Eigen::Map<detail::row_major_matrix<C>> result(data.data(), static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(n));
        if (scale == 0.0f || request.natural == 0.0f || k == 0) {
            result.setZero();
        } else {
            const auto alpha = static_cast<C>(double(request.natural) / double(scale));
            result.noalias() = alpha * (lhs * rhs);  // this form folds alpha into the GEMM, no temporary
        }
        return ScaledArray<R, P>(std::move(data), request.natural == 0.0f ? 0.0f : scale);
    } else {
        detail::row_major_matrix<C> product(static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(n));
        if (k == 0) product.setZero();
        else product.noalias() = lhs * rhs;
        const C* raw = product.data();
        return detail::finish<ops::matmul, Strategy, P, R, C>("matmul", shape, request,
                                                              [raw](std::size_t i) { return raw[i]; });
    }
}

}  // namespace scalify
