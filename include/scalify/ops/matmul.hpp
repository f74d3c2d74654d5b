#pragma once
/// \file matmul.hpp
/// matmul of 2-D ScaledArrays. By default through Eigen's GEMM: operands that are not float
/// (minifloats, half, bfloat16) are decoded whole into float panels first, then one sgemm
/// accumulates in float32 (double for double data); never element-by-element dot products. With
/// a static strategy the rescale natural/scale is GEMM's alpha, so a float x float matmul costs
/// one sgemm. Natural scale sa * sb; default_scaling multiplies it by sqrt(K).
///
///     auto y = matmul(x, w);                                  // data = x.w / sqrt(K)
///     auto z = matmul<dynamic_abs<float8_e4m3fn>, float8_e4m3fn>(x, w);
///
/// Accumulation model (tensor_core/accumulation.hpp): a tag argument, or else the thread's
/// tensor_core::accumulation_scope, replaces the float32 accumulation of the data-domain product
/// by a GPU's (fp8 codes x fp8 codes through tensor_core::gemm, bit for bit as cuBLASLt computes
/// them); the scales apply afterwards exactly as on the default path.
///
///     auto f = matmul(x, w, tensor_core::h100_cublaslt_fp8_fast{});   // this call
///     tensor_core::accumulation_scope<> scope("h100");                 // untagged calls here

#include <scalify/detail/parallel.hpp>
#include <scalify/ops/result.hpp>
#include <scalify/ops/shape.hpp>
#include <scalify/tensor_core/accumulation.hpp>
#include <scalify/tensor_core/gemm.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

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
        parallel_ranges(data.size(), [in, out](std::size_t, std::size_t begin, std::size_t end) {
            for (std::size_t i = begin; i < end; ++i) out[i] = load(in[i]);
        });
        return Eigen::Map<const row_major_matrix<C>>(panel.data(), rows, cols);
    }
}

/// Sentinel: no buffer to reuse.
struct no_buffer {};

/// The result's data buffer: the caller's when it is an xt::xarray<R> (its memory is reused when
/// it already holds M x N elements), else a new one.
template <class R, class Buffer>
[[nodiscard]] xt::xarray<R> result_buffer(Buffer&& buffer, const std::vector<std::size_t>& shape)
{
    const std::size_t count = shape[0] * shape[1];
    if constexpr (std::same_as<std::remove_cvref_t<Buffer>, xt::xarray<R>>) {
        xt::xarray<R> data = std::move(buffer);
        if (data.size() == count) data.reshape(shape);  // same memory
        else data = xt::xarray<R>::from_shape(shape);
        return data;
    } else {
        static_assert(std::same_as<std::remove_cvref_t<Buffer>, no_buffer>,
                      "matmul's buffer must be an xt::xarray of the result's element type");
        return xt::xarray<R>::from_shape(shape);
    }
}

/// The matrix itself, or its transpose as a view (Eigen reads it in place).
template <bool Transpose, class M>
[[nodiscard]] auto oriented(const M& matrix)
{
    if constexpr (Transpose) return matrix.transpose();
    else return matrix;
}

/// Products of at least this many multiply-adds are the ones Eigen's GEMM would split across
/// threads (it gives each thread at least 50 000).
inline constexpr double gemm_parallel_work = 100000.0;

/// dst = alpha * (lhs * rhs) through Eigen's GEMM, with bits that do not depend on the thread
/// count. Eigen's own parallel GEMM re-derives its depth blocking from the number of threads, so
/// with 512 or more products per sum a 2-thread result rounds differently from a 1-thread one.
/// Here every thread runs Eigen's sequential GEMM (Eigen does not fork inside a parallel region)
/// on a slab of dst whose edges sit on the GEMM micro-kernel's tile grid: each element is summed
/// in the order of the 1-thread product. Slabs run along dst's longer side, so the operand packed
/// again by every thread is the smaller one. With EIGEN_USE_BLAS the BLAS decides (and threads).
template <class Dst, class Lhs, class Rhs, class C>
void gemm_any_thread_count(Dst& dst, const Lhs& lhs, const Rhs& rhs, C alpha)
{
#if !defined(EIGEN_USE_BLAS)
    const Eigen::Index m = dst.rows(), n = dst.cols(), k = lhs.cols();
    const int threads = in_parallel_region() ? 1 : Eigen::nbThreads();  // 1 without OpenMP
    if (threads > 1 && m > 1 && n > 1 && double(m) * double(n) * double(k) >= gemm_parallel_work) {
        using traits = Eigen::internal::gebp_traits<C, C>;
        const auto grid = static_cast<Eigen::Index>(std::lcm(int(traits::mr), int(traits::nr)));
        const bool by_rows = m >= n;
        const Eigen::Index extent = by_rows ? m : n;
        const Eigen::Index slab = std::max<Eigen::Index>(grid, (extent + threads * grid - 1) / (threads * grid) * grid);
        const auto slabs = static_cast<std::size_t>((extent + slab - 1) / slab);
        parallel_tasks_in_region(slabs, threads, [&](std::size_t s) {
            const auto begin = static_cast<Eigen::Index>(s) * slab;
            const Eigen::Index size = std::min(slab, extent - begin);
            if (by_rows) dst.middleRows(begin, size).noalias() = alpha * (lhs.middleRows(begin, size) * rhs);
            else dst.middleCols(begin, size).noalias() = alpha * (lhs * rhs.middleCols(begin, size));
        });
        return;
    }
#endif
    dst.noalias() = alpha * (lhs * rhs);  // this form folds alpha into the GEMM, no temporary
}

/// Gemm over row-major M x K and K x N operands, transposing a stored-transposed one first.
template <class Gemm, bool TransposeA, bool TransposeB, class A, class B, class R>
void gemm_row_major(const xt::xarray<A>& a, const xt::xarray<B>& b, std::size_t m, std::size_t k, std::size_t n, R* out)
{
    if constexpr (TransposeA) {
        gemm_row_major<Gemm, false, TransposeB>(transposed_copy(a), b, m, k, n, out);
    } else if constexpr (TransposeB) {
        gemm_row_major<Gemm, false, false>(a, transposed_copy(b), m, k, n, out);
    } else {
        tensor_core::detail::gemm_into<Gemm>(a.data(), b.data(), m, k, n, out);
    }
}

/// matmul with the data-domain product accumulated by Gemm (a tensor_core GEMM model), or by
/// Eigen's float32 GEMM when Gemm is void. TransposeA / TransposeB: the operand is stored
/// transposed (a is K x M, b is N x K) and is read through a transposed view, never copied on the
/// Eigen path; the backward pass's products g.b^T and a^T.g use this.
template <class Strategy, class Out, class Gemm, bool TransposeA = false, bool TransposeB = false, class A, class PA,
          class B, class PB, class Buffer>
[[nodiscard]] auto matmul_with(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, Buffer&& buffer)
{
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    using R = detail::out_or_t<Out, promote_t<A, B>>;
    using P = common_policy_t<PA, PB>;
    static_assert(ScalingStrategy<Strategy>, "the Strategy argument does not satisfy scalify::ScalingStrategy");
    if (a.dimension() != 2 || b.dimension() != 2 ||
        a.shape()[TransposeA ? 0 : 1] != b.shape()[TransposeB ? 1 : 0]) {
        SCALIFY_THROW(shape_error(fmt::format("matmul: shapes {}{} and {}{} do not multiply (need (M, K) and (K, N))",
                                              shape_string(a.shape()), TransposeA ? " transposed" : "",
                                              shape_string(b.shape()), TransposeB ? " transposed" : "")));
    }
    const std::size_t m = a.shape()[TransposeA ? 1 : 0], k = a.shape()[TransposeA ? 0 : 1],
                      n = b.shape()[TransposeB ? 0 : 1];

    scale_request request;
    request.natural = static_cast<float>(double(a.scale()) * b.scale());
    request.input_scales[0] = a.scale();
    request.input_scales[1] = b.scale();
    request.input_count = 2;
    request.contraction = k;
    const std::vector<std::size_t> shape{m, n};

    if constexpr (!std::is_void_v<Gemm>) {
        // The GPU's accumulation of the data (codes times codes), then the scales as below.
        static_assert(std::same_as<C, float>, "tensor-core models take 8- and 16-bit operands, computed in float");
        if constexpr (!Strategy::needs_amax && std::same_as<R, C>) {
            const float scale = checked_output_scale<P>(
                scaling_traits<ops::matmul, Strategy>::template output_scale<P>(request), "matmul", request);
            xt::xarray<R> data = result_buffer<R>(std::forward<Buffer>(buffer), shape);
            R* out = data.data();
            if (scale == 0.0f || request.natural == 0.0f) {
                std::fill_n(out, m * n, R(0));
            } else {
                gemm_row_major<Gemm, TransposeA, TransposeB>(a.data(), b.data(), m, k, n, out);
                const auto alpha = static_cast<C>(double(request.natural) / double(scale));
                if (alpha != C(1))
                    for (std::size_t i = 0; i < m * n; ++i) out[i] *= alpha;
            }
            return ScaledArray<R, P>(std::move(data), request.natural == 0.0f ? 0.0f : scale);
        } else {
            thread_local std::vector<float> product;  // grows only, as the decoded panels do
            if (product.size() < m * n) product.resize(m * n);
            gemm_row_major<Gemm, TransposeA, TransposeB>(a.data(), b.data(), m, k, n, product.data());
            const float* raw = product.data();
            return finish<ops::matmul, Strategy, P, R, C>("matmul", shape, request, [raw](std::size_t i) { return raw[i]; });
        }
    } else {
        // Decoded panels live in per-thread buffers that only grow: a fresh allocation per call
        // costs more in first-touch page faults than the decode itself.
        thread_local row_major_matrix<C> a_panel, b_panel;
        const auto lhs = oriented<TransposeA>(as_matrix<C>(a.data(), a_panel));
        const auto rhs = oriented<TransposeB>(as_matrix<C>(b.data(), b_panel));

        if constexpr (!Strategy::needs_amax && std::same_as<R, C>) {
            // Static scale: fold natural / scale into GEMM's alpha and write straight into the result.
            const float scale = checked_output_scale<P>(
                scaling_traits<ops::matmul, Strategy>::template output_scale<P>(request), "matmul", request);
            xt::xarray<R> data = result_buffer<R>(std::forward<Buffer>(buffer), shape);
            Eigen::Map<row_major_matrix<C>> result(data.data(), static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(n));
            if (scale == 0.0f || request.natural == 0.0f || k == 0) {
                result.setZero();
            } else {
                const auto alpha = static_cast<C>(double(request.natural) / double(scale));
                gemm_any_thread_count(result, lhs, rhs, alpha);
            }
            return ScaledArray<R, P>(std::move(data), request.natural == 0.0f ? 0.0f : scale);
        } else {
            row_major_matrix<C> product(static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(n));
            if (k == 0) product.setZero();
            else gemm_any_thread_count(product, lhs, rhs, C(1));
            const C* raw = product.data();
            return finish<ops::matmul, Strategy, P, R, C>("matmul", shape, request, [raw](std::size_t i) { return raw[i]; });
        }
    }
}

/// matmul_with under the thread's tensor_core::current_accumulation() (exact for operand pairs
/// no model covers).
template <class Strategy, class Out, bool TransposeA = false, bool TransposeB = false, class A, class PA, class B,
          class PB, class Buffer = no_buffer>
[[nodiscard]] auto matmul_scoped(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, Buffer&& buffer = {})
{
    using h100 = tensor_core::operand_gemm_t<tensor_core::h100_cublaslt_fp8, A, B>;
    using h100_fast = tensor_core::operand_gemm_t<tensor_core::h100_cublaslt_fp8_fast, A, B>;
    if constexpr (std::is_void_v<h100> && std::is_void_v<h100_fast>) {
        return matmul_with<Strategy, Out, void, TransposeA, TransposeB>(a, b, std::forward<Buffer>(buffer));
    } else {
        switch (tensor_core::current_accumulation()) {
        case tensor_core::accumulation::h100:
            return matmul_with<Strategy, Out, h100, TransposeA, TransposeB>(a, b, std::forward<Buffer>(buffer));
        case tensor_core::accumulation::h100_fast:
            return matmul_with<Strategy, Out, h100_fast, TransposeA, TransposeB>(a, b, std::forward<Buffer>(buffer));
        case tensor_core::accumulation::exact: break;
        }
        return matmul_with<Strategy, Out, void, TransposeA, TransposeB>(a, b, std::forward<Buffer>(buffer));
    }
}

/// a.b^T and a^T.b without materialising the transpose (matmul_vjp's two products).
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB>
[[nodiscard]] auto matmul_transposed_b(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return matmul_scoped<Strategy, Out, false, true>(a, b);
}
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB>
[[nodiscard]] auto matmul_transposed_a(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return matmul_scoped<Strategy, Out, true, false>(a, b);
}

}  // namespace detail

/// a (M x K) times b (K x N). shape_error unless both are 2-D with matching inner dimensions.
/// The optional third argument is a buffer to write the result into (its memory is reused when it
/// already holds M x N elements), typically the data of the previous result:
///     c = matmul(a, b, std::move(c).release_data());   // no allocation in a loop
/// The data-domain product accumulates as the thread's tensor_core::current_accumulation() says
/// (exact float32 outside any accumulation_scope) for the operand pairs a model covers.
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB,
          class Buffer = detail::no_buffer>
    requires(!tensor_core::AccumulationModel<std::remove_cvref_t<Buffer>>)
[[nodiscard]] auto matmul(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, Buffer&& buffer = {})
{
    return detail::matmul_scoped<Strategy, Out>(a, b, std::forward<Buffer>(buffer));
}

/// matmul accumulating as Model says for this call, whatever the thread's scope:
///     auto y = matmul(x, w, tensor_core::h100_cublaslt_fp8{});
///     c = matmul(x, w, tensor_core::h100_cublaslt_fp8{}, std::move(c).release_data());
/// Operand pairs the model does not cover (tensor_core::operand_gemm) accumulate exactly.
template <class Strategy = default_scaling, class Out = void, tensor_core::AccumulationModel Model, class A, class PA,
          class B, class PB, class Buffer = detail::no_buffer>
[[nodiscard]] auto matmul(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, Model, Buffer&& buffer = {})
{
    return detail::matmul_with<Strategy, Out, tensor_core::operand_gemm_t<Model, A, B>>(a, b, std::forward<Buffer>(buffer));
}

}  // namespace scalify
