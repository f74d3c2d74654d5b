#pragma once
/// \file matmul.hpp
/// matmul of ScaledArrays: 2-D, and over leading batch dimensions as numpy's. By default through Eigen's GEMM: operands that are not float
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
///     tensor_core::accumulation_scope<> scope("b200");                 // untagged calls here
/// The model reaches the body as a run-time GEMM (tensor_core::grid_gemm_fn): the body is compiled
/// once whatever the model, a model's engine only where a scope or tag can select it.

#include <scalify/detail/parallel.hpp>
#include <scalify/numeric/dtype.hpp>
#include <scalify/ops/reduce.hpp>
#include <scalify/ops/result.hpp>
#include <scalify/ops/shape.hpp>
#include <scalify/tensor_core/accumulation.hpp>
#include <scalify/tensor_core/gemm.hpp>

#include <scalify/detail/eigen_core.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <numeric>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(EIGEN_USE_BLAS) && defined(__AVX512F__)
// OpenBLAS's name for the kernels it chose when it loaded (cblas.h declares it). Weak: another
// BLAS, which lacks it, leaves the address null.
extern "C" char* openblas_get_corename(void) __attribute__((weak));
#endif

namespace scalify {

namespace detail {

template <class C>
using row_major_matrix = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The data of an operand as C values: the data itself when T is C, else a decoded copy held in
/// `panel` (which only grows).
template <class C, class T>
[[nodiscard]] const C* decoded(const xt::xarray<T>& data, row_major_matrix<C>& panel)
{
    if constexpr (std::same_as<T, C>) {
        return data.data();
    } else {
        const auto count = static_cast<Eigen::Index>(data.size());
        if (panel.size() < count) panel.resize(count, 1);
        const T* in = data.data();
        C* out = panel.data();
        parallel_ranges(data.size(), [in, out](std::size_t, std::size_t begin, std::size_t end) {
            for (std::size_t i = begin; i < end; ++i) out[i] = load(in[i]);
        });
        return panel.data();
    }
}

/// Per-thread decode buffers of matmul's operands (Slot 0: a, 1: b), shared by every operand
/// type: a fresh allocation per call costs more in first-touch page faults than the decode.
template <class C, int Slot>
[[nodiscard]] row_major_matrix<C>& operand_panel()
{
    thread_local row_major_matrix<C> panel;
    return panel;
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

/// Whether OpenBLAS's core name (openblas_get_corename(): "Haswell", "Zen", "SkylakeX", or
/// upper case, "SKYLAKEX", in a build for one CPU) names kernels that use AVX-512.
[[nodiscard]] constexpr bool openblas_core_has_avx512(std::string_view name) noexcept
{
    const auto same_letters = [name](std::string_view lower) {
        if (name.size() != lower.size()) return false;
        for (std::size_t i = 0; i < name.size(); ++i) {
            const char c = name[i] >= 'A' && name[i] <= 'Z' ? static_cast<char>(name[i] - 'A' + 'a') : name[i];
            if (c != lower[i]) return false;
        }
        return true;
    };
    return same_letters("skylakex") || same_letters("cooperlake") || same_letters("sapphirerapids");
}

/// Whether float and double products go to the BLAS (EIGEN_USE_BLAS), decided once per process.
/// Not where this code is compiled for AVX-512 and the BLAS is an OpenBLAS running kernels
/// without it: Debian 12's OpenBLAS 0.3.21 runs its Haswell (AVX2) kernels on AMD Zen 4 and Zen 5,
/// which Eigen's AVX-512 kernel outruns by 1.2-1.4x on the training examples' shapes, while
/// OpenBLAS's own AVX-512 kernels (SkylakeX, Cooperlake, SapphireRapids: chosen on Intel CPUs, or
/// by OPENBLAS_CORETYPE=SkylakeX) outrun Eigen's by 1.3-1.4x (docs/benchmarks.md). A BLAS that is
/// not OpenBLAS is always used. Where Eigen's kernel runs, products sum in its order, on any
/// thread count the same.
[[nodiscard]] inline bool blas_runs_products() noexcept
{
#if !defined(EIGEN_USE_BLAS)
    return false;
#elif defined(__AVX512F__)
    static const bool runs = [] {
        const char* name = openblas_get_corename != nullptr ? openblas_get_corename() : nullptr;
        return name == nullptr || openblas_core_has_avx512(name);
    }();
    return runs;
#else
    return true;
#endif
}

/// The start of every product into out (m x n, row stride ldo): out cleared unless the product
/// accumulates into it. Returns whether any product is left to sum (none when K = 0).
template <class C>
[[nodiscard]] bool start_product(C* out, std::size_t ldo, std::size_t m, std::size_t k, std::size_t n, bool accumulate)
{
    if (m == 0 || n == 0) return false;
    if (!accumulate) {
        for (std::size_t row = 0; row < m; ++row) std::fill_n(out + row * ldo, n, C(0));
    }
    return k != 0;
}

/// y += alpha * M x through Eigen's GEMV kernel: M (rows x cols) stored in MatrixOrder with outer
/// stride ldm, x with element stride incx, y with element stride incy. The column-major kernel
/// reads a strided x but writes a contiguous y; the row-major kernel reads a contiguous x and
/// writes a strided y: the other side goes through a contiguous copy where it is strided.
template <class C, int MatrixOrder>
void eigen_matrix_vector(const C* m, std::size_t ldm, std::size_t rows, std::size_t cols, const C* x, std::size_t incx, C* y,
                         std::size_t incy, C alpha)
{
    using Eigen::Index;
    constexpr bool column_major = MatrixOrder == Eigen::ColMajor;
    using matrix_mapper = Eigen::internal::const_blas_data_mapper<C, Index, MatrixOrder>;
    using vector_mapper = Eigen::internal::const_blas_data_mapper<C, Index, column_major ? Eigen::RowMajor : Eigen::ColMajor>;
    std::vector<C> contiguous;
    if (column_major && incy != 1) {
        contiguous.resize(rows);
        for (std::size_t i = 0; i < rows; ++i) contiguous[i] = y[i * incy];
    } else if (!column_major && incx != 1) {
        contiguous.resize(cols);
        for (std::size_t j = 0; j < cols; ++j) contiguous[j] = x[j * incx];
        x = contiguous.data();
        incx = 1;
    }
    C* const target = column_major && incy != 1 ? contiguous.data() : y;
    Eigen::internal::general_matrix_vector_product<Index, C, matrix_mapper, MatrixOrder, false, C, vector_mapper, false>::run(
        Index(rows), Index(cols), matrix_mapper(m, Index(ldm)), vector_mapper(x, Index(incx)), target,
        column_major ? Index(1) : Index(incy), alpha);
    if (column_major && incy != 1) {
        for (std::size_t i = 0; i < rows; ++i) y[i * incy] = contiguous[i];
    }
}

/// out = alpha * op(a) op(b) (+ out when `accumulate`) for a product with one column (n = 1: op(a)
/// times b's column) or one row (m = 1: the transposed problem, op(b)^T times a's row), through
/// Eigen's GEMV kernel; strides as gemm_slab's.
template <class C, bool TransposeA, bool TransposeB>
void gemm_vector(const C* a, std::size_t lda, const C* b, std::size_t ldb, C* out, std::size_t ldo, std::size_t m,
                 std::size_t k, std::size_t n, C alpha, bool accumulate)
{
    if (!start_product(out, ldo, m, k, n, accumulate)) return;
    if (n == 1) {
        // op(a) is m x k: row-major with row stride lda, or (TransposeA) column-major with column stride lda.
        constexpr int order = TransposeA ? Eigen::ColMajor : Eigen::RowMajor;
        eigen_matrix_vector<C, order>(a, lda, m, k, b, TransposeB ? 1 : ldb, out, ldo, alpha);
    } else {
        // out's row = op(b)^T (n x k) times op(a)'s row: op(b)^T is column-major with column stride
        // ldb, or (TransposeB) row-major with row stride ldb.
        constexpr int order = TransposeB ? Eigen::RowMajor : Eigen::ColMajor;
        eigen_matrix_vector<C, order>(b, ldb, n, k, a, TransposeA ? lda : 1, out, 1, alpha);
    }
}

#if defined(EIGEN_USE_BLAS)
/// out = alpha * op(a) op(b) (+ out when `accumulate`) through the BLAS's sgemm or dgemm, with
/// strides as gemm_slab's; false (nothing done) where the BLAS cannot take the call (a size beyond
/// int, an empty result, an element type it lacks).
template <class C, bool TransposeA, bool TransposeB>
[[nodiscard]] bool blas_product(const C* a, std::size_t lda, const C* b, std::size_t ldb, C* out, std::size_t ldo,
                                std::size_t m, std::size_t k, std::size_t n, C alpha, bool accumulate)
{
    // The BLAS straight, with beta = 0: Eigen's product zero-fills out and then accumulates into
    // it (beta = 1), a pass over the result that was 5 % of a char_lm step; OpenBLAS's small-matrix
    // kernels (the attention's per-head products) then write out without reading it. The call is
    // Eigen's own for a row-major result (the column-major transposed problem), so the bits are.
    if constexpr (std::same_as<C, float> || std::same_as<C, double>) {
        constexpr auto int_max = static_cast<std::size_t>(std::numeric_limits<int>::max());
        if (m <= int_max && n <= int_max && k <= int_max && lda <= int_max && ldb <= int_max && ldo <= int_max && m > 0 &&
            n > 0) {
            const char trans_b = TransposeB ? 'T' : 'N', trans_a = TransposeA ? 'T' : 'N';
            const int rows = static_cast<int>(n), cols = static_cast<int>(m), depth = static_cast<int>(k);
            const int ld_b = static_cast<int>(std::max<std::size_t>(ldb, 1)), ld_a = static_cast<int>(std::max<std::size_t>(lda, 1));
            const int ld_out = static_cast<int>(ldo);
            const C beta = accumulate ? C(1) : C(0);
            if constexpr (std::same_as<C, float>) {
                sgemm_(&trans_b, &trans_a, &rows, &cols, &depth, &alpha, b, &ld_b, a, &ld_a, &beta, out, &ld_out);
            } else {
                dgemm_(&trans_b, &trans_a, &rows, &cols, &depth, &alpha, b, &ld_b, a, &ld_a, &beta, out, &ld_out);
            }
            return true;
        }
    }
    return false;
}
#endif

/// out (m x n, row-major, row stride ldo) = alpha * op(a) op(b) (+ out when `accumulate`: the
/// GEMM's beta = 1, linear's bias rows) through Eigen's sequential GEMM kernel, whatever the
/// shape (a thread's slab of one column is summed as the whole product sums it); a is stored
/// m x k (k x m when TransposeA) with row stride lda, b likewise. Every matrix product, batched
/// or not, forward or backward, and every thread's slab goes through it (gemm_any_thread_count
/// sends a product with one row or column to gemm_vector). The kernel is called directly rather
/// than through Eigen's product expressions: those instantiate the coefficient-wise and GEMV paths
/// for every layout, a hundred and more expression types that were a fifth of a small training
/// program's compile time and half of its -O0 -g binary (debug names). Each sum then runs in the
/// GEMM's order for every size (Eigen's expressions multiplied products with M + N + K < 20
/// coefficient by coefficient). The loop is Eigen 3.4's sequential general_matrix_matrix_product
/// (its blocking, packing and micro-kernel, so its bits), written out because EIGEN_USE_BLAS
/// replaces that function's float and double bodies by the BLAS: here the kernel stays Eigen's
/// wherever blas_runs_products() says no.
template <class C, bool TransposeA, bool TransposeB>
void gemm_slab(const C* a, std::size_t lda, const C* b, std::size_t ldb, C* out, std::size_t ldo, std::size_t m,
               std::size_t k, std::size_t n, C alpha, bool accumulate)
{
    if (!start_product(out, ldo, m, k, n, accumulate)) return;
    using Eigen::Index;
    namespace ei = Eigen::internal;
    // The column-major problem out^T (n x m) = op(b)^T op(a)^T, as Eigen runs a row-major result.
    constexpr int lhs_order = TransposeB ? Eigen::RowMajor : Eigen::ColMajor;
    constexpr int rhs_order = TransposeA ? Eigen::RowMajor : Eigen::ColMajor;
    using traits = ei::gebp_traits<C, C>;
    using lhs_mapper = ei::const_blas_data_mapper<C, Index, lhs_order>;
    using rhs_mapper = ei::const_blas_data_mapper<C, Index, rhs_order>;
    using out_mapper = ei::blas_data_mapper<C, Index, Eigen::ColMajor, Eigen::Unaligned, 1>;
    const Index rows = Index(n), cols = Index(m), depth = Index(k);
    ei::gemm_blocking_space<Eigen::RowMajor, C, C, Eigen::Dynamic, Eigen::Dynamic, Eigen::Dynamic> blocking(Index(m), Index(n),
                                                                                                         Index(k), 1, true);
    const Index kc = blocking.kc(), mc = std::min(rows, blocking.mc()), nc = std::min(cols, blocking.nc());
    ei::gemm_pack_lhs<C, Index, lhs_mapper, traits::mr, traits::LhsProgress, typename traits::LhsPacket4Packing, lhs_order> pack_lhs;
    ei::gemm_pack_rhs<C, Index, rhs_mapper, traits::nr, rhs_order> pack_rhs;
    ei::gebp_kernel<C, C, Index, out_mapper, traits::mr, traits::nr, false, false> gebp;
    const lhs_mapper lhs(b, Index(ldb));
    const rhs_mapper rhs(a, Index(lda));
    const out_mapper res(out, Index(ldo));
    // The packed panels, in per-thread buffers that only grow (aligned as the kernel loads them).
    thread_local std::vector<C, Eigen::aligned_allocator<C>> panel_a, panel_b;
    if (panel_a.size() < static_cast<std::size_t>(kc * mc)) panel_a.resize(static_cast<std::size_t>(kc * mc));
    if (panel_b.size() < static_cast<std::size_t>(kc * nc)) panel_b.resize(static_cast<std::size_t>(kc * nc));
    C* const block_a = panel_a.data();
    C* const block_b = panel_b.data();
    const bool pack_rhs_once = mc != rows && kc == depth && nc == cols;
    for (Index i2 = 0; i2 < rows; i2 += mc) {
        const Index actual_mc = std::min(i2 + mc, rows) - i2;
        for (Index k2 = 0; k2 < depth; k2 += kc) {
            const Index actual_kc = std::min(k2 + kc, depth) - k2;
            pack_lhs(block_a, lhs.getSubMapper(i2, k2), actual_kc, actual_mc);
            for (Index j2 = 0; j2 < cols; j2 += nc) {
                const Index actual_nc = std::min(j2 + nc, cols) - j2;
                if (!pack_rhs_once || i2 == 0) pack_rhs(block_b, rhs.getSubMapper(k2, j2), actual_kc, actual_nc);
                gebp(res.getSubMapper(i2, j2), block_a, block_b, actual_mc, actual_kc, actual_nc, alpha);
            }
        }
    }
}

/// out (m x n, row-major, dense) = alpha * op(a) op(b), a stored with row stride lda and b with
/// ldb as in gemm_slab, with bits that do not depend on the thread count. A product with one row
/// or one column runs Eigen's GEMV kernel on one thread (gemm_vector). Eigen's own parallel GEMM
/// re-derives its depth blocking from the number of threads, so with 512 or more products per sum
/// a 2-thread result rounds differently from a 1-thread one. Here every thread runs Eigen's
/// sequential GEMM (Eigen does not fork inside a parallel region) on a slab of out whose edges
/// sit on the GEMM micro-kernel's tile grid: each element is summed in the order of the 1-thread
/// product. Slabs run along out's longer side, so the operand packed again by every thread is the
/// smaller one. The slabs fork where the work pays for it (gemm_work_pays_fork). Where the BLAS
/// runs the products (blas_runs_products) it decides, and threads.
template <class C, bool TransposeA, bool TransposeB>
void gemm_any_thread_count(const C* a, std::size_t lda, const C* b, std::size_t ldb, std::size_t m, std::size_t k,
                           std::size_t n, C* out, C alpha, bool accumulate)
{
#if defined(EIGEN_USE_BLAS)
    if (blas_runs_products() &&
        blas_product<C, TransposeA, TransposeB>(a, lda, b, ldb, out, n, m, k, n, alpha, accumulate)) {
        return;
    }
#endif
    if (m == 1 || n == 1) {  // Eigen's GEMV kernel, on one thread
        gemm_vector<C, TransposeA, TransposeB>(a, lda, b, ldb, out, n, m, k, n, alpha, accumulate);
        return;
    }
    const int threads = in_parallel_region() ? 1 : Eigen::nbThreads();  // 1 without OpenMP
    if (threads > 1 && gemm_work_pays_fork(double(m) * double(n) * double(k))) {
        using traits = Eigen::internal::gebp_traits<C, C>;
        const auto grid = static_cast<std::size_t>(std::lcm(int(traits::mr), int(traits::nr)));
        const bool by_rows = m >= n;
        const std::size_t extent = by_rows ? m : n;
        const std::size_t slab = std::max<std::size_t>(grid, (extent + threads * grid - 1) / (threads * grid) * grid);
        parallel_tasks_in_region((extent + slab - 1) / slab, threads, [&](std::size_t s) {
            const std::size_t begin = s * slab, size = std::min(slab, extent - begin);
            if (by_rows) {
                gemm_slab<C, TransposeA, TransposeB>(a + (TransposeA ? begin : begin * lda), lda, b, ldb, out + begin * n, n,
                                                     size, k, n, alpha, accumulate);
            } else {
                gemm_slab<C, TransposeA, TransposeB>(a, lda, b + (TransposeB ? begin * ldb : begin), ldb, out + begin, n, m, k,
                                                     size, alpha, accumulate);
            }
        });
        return;
    }
    gemm_slab<C, TransposeA, TransposeB>(a, lda, b, ldb, out, n, m, k, n, alpha, accumulate);
}
/// The same for dense operands (row strides k and n; m and k when transposed).
template <class C, bool TransposeA, bool TransposeB>
void gemm_any_thread_count(const C* a, const C* b, std::size_t m, std::size_t k, std::size_t n, C* out, C alpha,
                           bool accumulate = false)
{
    gemm_any_thread_count<C, TransposeA, TransposeB>(a, TransposeA ? m : k, b, TransposeB ? k : n, m, k, n, out, alpha,
                                                     accumulate);
}

/// What a matmul's rule sees: natural scale sa sb, both input scales, contraction K.
template <class A, class PA, class B, class PB>
[[nodiscard]] scale_request matmul_request(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, std::size_t k) noexcept
{
    scale_request request;
    request.natural = static_cast<float>(double(a.scale()) * b.scale());
    request.input_scales[0] = a.scale();
    request.input_scales[1] = b.scale();
    request.input_count = 2;
    request.contraction = k;
    return request;
}

/// The formats whose grids a product's float32 operands lie on: a matmul_precision_scope's
/// operands after their casts, held as float32 values (exact), so that the recipe compiles one
/// product body whatever its formats. float32: plain float32 data. Only a tensor-core model's
/// accumulation depends on them (it reads the operands as those types); Eigen's path multiplies
/// the values.
struct operand_grids {
    dtype a = dtype::float32;
    dtype b = dtype::float32;
};

/// In place of operand_grids: the operands' types say what they hold (the default).
struct typed_operands {};

/// The dtype under which an operand of type T looks up its GEMM in a tensor_core::gemm_table: its
/// own, or float32 for another type computed in float (no unit takes it; a tf32 choice runs it
/// as float32).
template <class T>
inline constexpr dtype table_dtype = [] {
    if constexpr (RuntimeDtype<T>) return dtype_of<T>;
    else return dtype::float32;
}();

/// The GEMM of the calling thread's tensor_core::accumulation_scope for operands A and B (float32
/// ones on `grids` where given: the grids' formats), or nullptr: exact float32 (no scope, a
/// product not computed in float, a pair the GPU has no unit for). One table lookup on the
/// calling thread (the setting is thread-local; the batched product's workers use the caller's).
template <class A, class B, class Grids = typed_operands>
[[nodiscard]] tensor_core::grid_gemm_fn current_gemm(Grids grids = {}) noexcept
{
    if constexpr (!std::same_as<std::common_type_t<compute_t<A>, compute_t<B>>, float>) {
        return nullptr;
    } else {
        const tensor_core::gemm_table* table = tensor_core::detail::accumulation_state();
        if (table == nullptr) return nullptr;
        dtype a = table_dtype<A>, b = table_dtype<B>;
        if constexpr (std::same_as<Grids, operand_grids>) {
            if constexpr (std::same_as<A, float>) a = grids.a;
            if constexpr (std::same_as<B, float>) b = grids.b;
        } else {
            (void)grids;
        }
        return (*table)(a, b).run;
    }
}

/// The GEMM of accumulation model Model (a tag passed to matmul) for operands A and B, or nullptr
/// (exact float32: operand_gemm has no model for the pair).
template <tensor_core::AccumulationModel Model, class A, class B>
[[nodiscard]] constexpr tensor_core::grid_gemm_fn model_gemm() noexcept
{
    using Gemm = tensor_core::operand_gemm_t<Model, A, B>;
    if constexpr (std::is_void_v<Gemm>) return nullptr;
    else return &tensor_core::detail::gemm_into_on_grid<Gemm, A, B>;
}

/// A row-major (rows x cols) float32 matrix's transpose, in a per-thread buffer (Slot 0: a, 1: b).
template <int Slot>
[[nodiscard]] const float* transposed_panel(const float* data, std::size_t rows, std::size_t cols)
{
    thread_local std::vector<float> panel;
    if (panel.size() < rows * cols) panel.resize(rows * cols);
    transpose_tiles(data, cols, panel.data(), rows, cols, rows);
    return panel.data();
}

/// out (M x N) = gemm over a and b as row-major M x K and K x N float32 values (their data decoded
/// once, a stored-transposed operand transposed first).
template <bool TransposeA, bool TransposeB, class A, class B>
void run_gemm(tensor_core::grid_gemm_fn gemm, const xt::xarray<A>& a, const xt::xarray<B>& b, std::size_t m,
              std::size_t k, std::size_t n, float* out)
{
    const float* pa = decoded<float>(a, operand_panel<float, 0>());
    const float* pb = decoded<float>(b, operand_panel<float, 1>());
    if constexpr (TransposeA) pa = transposed_panel<0>(pa, k, m);
    if constexpr (TransposeB) pb = transposed_panel<1>(pb, n, k);
    gemm(pa, pb, m, k, n, out);
}

/// (M, K, N) of a 2-D product whose operands may be stored transposed, or shape_error naming both
/// shapes. An operand of more than two axes is read as the matrix of its rows (the product of
/// its leading extents by its last), which is its row-major memory: the batched product's
/// rows and its backward pass multiply (B, T, K) activations without reshaped copies. The
/// public entry points pass 2-D operands only. One function per shape type, not per operand type.
template <class Shape>
[[nodiscard]] std::array<std::size_t, 3> matmul_extents(const Shape& a, bool transpose_a, const Shape& b, bool transpose_b)
{
    const auto matrix = [](const Shape& s) -> std::array<std::size_t, 2> {
        std::array<std::size_t, 2> rows_cols{1, s.empty() ? 0 : static_cast<std::size_t>(s[s.size() - 1])};
        for (std::size_t d = 0; d + 1 < s.size(); ++d) rows_cols[0] *= static_cast<std::size_t>(s[d]);
        return rows_cols;
    };
    const auto ma = matrix(a), mb = matrix(b);
    if (a.size() < 2 || b.size() < 2 || ma[transpose_a ? 0 : 1] != mb[transpose_b ? 1 : 0]) {
        SCALIFY_THROW(shape_error(fmt::format("matmul: shapes {}{} and {}{} do not multiply (need (M, K) and (K, N))",
                                              shape_string(a), transpose_a ? " transposed" : "", shape_string(b),
                                              transpose_b ? " transposed" : "")));
    }
    return {ma[transpose_a ? 1 : 0], ma[transpose_a ? 0 : 1], mb[transpose_b ? 0 : 1]};
}

/// The checked output scale of a matmul under a static rule (no amax needed).
template <ScalePolicy P>
[[nodiscard]] float static_matmul_scale(const scale_request& request, scale_rule rule)
{
    return checked_output_scale<P>(rule(request), "matmul", request);
}

/// Strategy's matmul rule for policy P. The functions below take it at run time and NeedsAmax
/// (Strategy::needs_amax) as a template argument: their bodies, multiplied by the operand types,
/// the tensor-core models and the transposes, are compiled once for all strategies alike.
template <class Strategy, ScalePolicy P>
[[nodiscard]] constexpr scale_rule matmul_rule() noexcept
{
    return rule_for<ops::matmul, Strategy, P>();
}

/// The result (R, policy P) of a raw data-domain product in compute type C: the strategy's scale,
/// then one store loop (finish).
template <bool NeedsAmax, class R, class C, ScalePolicy P>
[[nodiscard]] ScaledArray<R, P> finish_matmul(const std::vector<std::size_t>& shape, const scale_request& request,
                                              scale_rule rule, const C* raw)
{
    return finish_by_rule<NeedsAmax, P, R, C>("matmul", shape, request, rule, buffer_source<C>{raw});
}

/// The raw product (count values of C) of a matmul whose result is stored after its scale is known
/// (an amax-scaled one, or one stored in another type): a per-thread scratch buffer, read only
/// until finish_matmul returns.
struct raw_product_tag {};
template <class C>
[[nodiscard]] C* raw_product(std::size_t count)
{
    return scratch<C, raw_product_tag>(count);
}

/// The result buffer of a 2-D product: the caller's (when it is an xt::xarray<R>), else new.
template <class R, class Buffer>
[[nodiscard]] xt::xarray<R>* caller_buffer(Buffer& buffer) noexcept
{
    if constexpr (std::same_as<std::remove_cvref_t<Buffer>, xt::xarray<R>>) return &buffer;
    else return nullptr;
}

/// matmul on Eigen's path over operands already in C (the data itself, or decoded panels),
/// row-major, stored transposed where TransposeA / TransposeB say (read through a transposed
/// view, never copied). Every operand-type pair shares it: the backward pass multiplies each
/// cotangent type by each operand type, and only the decoding depends on them.
template <bool NeedsAmax, class R, class C, ScalePolicy P, bool TransposeA, bool TransposeB>
[[nodiscard]] ScaledArray<R, P> eigen_matmul(const C* a, const C* b, std::size_t m, std::size_t k, std::size_t n,
                                             const scale_request& request, scale_rule rule, xt::xarray<R>* buffer)
{
    const std::vector<std::size_t> shape{m, n};
    if constexpr (!NeedsAmax && std::same_as<R, C>) {
        // Static scale: fold natural / scale into GEMM's alpha and write straight into the result.
        const float scale = static_matmul_scale<P>(request, rule);
        xt::xarray<R> data = buffer ? result_buffer<R>(std::move(*buffer), shape) : result_buffer<R>(no_buffer{}, shape);
        if (scale == 0.0f || request.natural == 0.0f || k == 0) {
            std::fill_n(data.data(), m * n, C(0));
        } else {
            const auto alpha = static_cast<C>(double(request.natural) / double(scale));
            gemm_any_thread_count<C, TransposeA, TransposeB>(a, b, m, k, n, data.data(), alpha);
        }
        ScaledArray<R, P> result(std::move(data), request.natural == 0.0f ? 0.0f : scale);
        check_output("matmul", result);
        return result;
    } else {
        (void)buffer;
        C* const product = raw_product<C>(m * n);
        if (k != 0) gemm_any_thread_count<C, TransposeA, TransposeB>(a, b, m, k, n, product, C(1));
        else std::fill_n(product, m * n, C(0));
        return finish_matmul<NeedsAmax, R, C, P>(shape, request, rule, product);
    }
}

/// matmul with the data-domain product accumulated by `gemm` (a tensor_core GEMM model's, chosen at
/// run time: current_gemm, model_gemm), or by Eigen's float32 GEMM when it is nullptr: one body
/// whatever the model. TransposeA / TransposeB: the operand is stored transposed (a is K x M, b
/// is N x K); the backward pass's products g.b^T and a^T.g use this.
template <bool NeedsAmax, class Out, bool TransposeA = false, bool TransposeB = false, class A, class PA, class B,
          class PB, class Buffer>
[[nodiscard]] auto matmul_with(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, scale_rule rule, Buffer&& buffer,
                               tensor_core::grid_gemm_fn gemm = nullptr)
{
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    using R = detail::out_or_t<Out, promote_t<A, B>>;
    using P = common_policy_t<PA, PB>;
    if constexpr (!NeedsAmax && std::same_as<R, C>) {
        static_assert(std::same_as<std::remove_cvref_t<Buffer>, xt::xarray<R>> ||
                          std::same_as<std::remove_cvref_t<Buffer>, no_buffer>,
                      "matmul's buffer must be an xt::xarray of the result's element type");
    }
    const auto [m, k, n] = matmul_extents(a.shape(), TransposeA, b.shape(), TransposeB);
    const scale_request request = matmul_request(a, b, k);

    if constexpr (!std::same_as<C, float>) {
        (void)gemm;  // tensor-core models take operands computed in float
    } else if (gemm != nullptr) {
        // The GPU's accumulation of the data (codes times codes), then the scales as on Eigen's path.
        const std::vector<std::size_t> shape{m, n};
        if constexpr (!NeedsAmax && std::same_as<R, C>) {
            const float scale = static_matmul_scale<P>(request, rule);
            xt::xarray<R> data = result_buffer<R>(std::forward<Buffer>(buffer), shape);
            R* out = data.data();
            if (scale == 0.0f || request.natural == 0.0f) {
                std::fill_n(out, m * n, R(0));
            } else {
                run_gemm<TransposeA, TransposeB>(gemm, a.data(), b.data(), m, k, n, out);
                const auto alpha = static_cast<C>(double(request.natural) / double(scale));
                if (alpha != C(1))
                    for (std::size_t i = 0; i < m * n; ++i) out[i] *= alpha;
            }
            ScaledArray<R, P> result(std::move(data), request.natural == 0.0f ? 0.0f : scale);
            check_output("matmul", result);
            return result;
        } else {
            float* const product = raw_product<float>(m * n);
            run_gemm<TransposeA, TransposeB>(gemm, a.data(), b.data(), m, k, n, product);
            return finish_matmul<NeedsAmax, R, C, P>(shape, request, rule, product);
        }
    }
    return eigen_matmul<NeedsAmax, R, C, P, TransposeA, TransposeB>(decoded<C>(a.data(), operand_panel<C, 0>()),
                                                                    decoded<C>(b.data(), operand_panel<C, 1>()), m, k, n,
                                                                    request, rule, caller_buffer<R>(buffer));
}

/// matmul_with under the thread's tensor_core::accumulation_scope (current_gemm).
template <bool NeedsAmax, class Out, bool TransposeA = false, bool TransposeB = false, class A, class PA, class B,
          class PB, class Buffer = no_buffer, class Grids = typed_operands>
[[nodiscard]] auto matmul_scoped(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, scale_rule rule,
                                 Buffer&& buffer = {}, Grids grids = {})
{
    return matmul_with<NeedsAmax, Out, TransposeA, TransposeB>(a, b, rule, std::forward<Buffer>(buffer),
                                                               current_gemm<A, B>(grids));
}

/// The shapes of numpy's matmul: operands (..., M, K) and (..., K, N), their leading (batch)
/// dimensions broadcast; a 1-D first operand is a row (K) and a 1-D second one a column (K),
/// whose unit axis the result drops.
struct batched_shapes {
    std::vector<std::size_t> a_batch, b_batch, batch;  ///< each operand's batch shape, and their broadcast
    std::size_t m = 1, k = 0, n = 1;
    bool a_vector = false, b_vector = false;
    std::vector<std::size_t> out;  ///< the result's shape

    template <class SA, class SB>
    batched_shapes(const SA& a, const SB& b)
    {
        const auto fail = [&](const char* why) {
            SCALIFY_THROW(shape_error(fmt::format("matmul: shapes {} and {} do not multiply ({})", shape_string(a),
                                                  shape_string(b), why)));
        };
        if (a.size() == 0 || b.size() == 0) fail("0-d operands: use mul");
        a_vector = a.size() == 1;
        b_vector = b.size() == 1;
        k = a[a.size() - 1];
        if ((b_vector ? b[0] : b[b.size() - 2]) != k) fail("the inner dimensions differ");
        if (!a_vector) m = a[a.size() - 2];
        if (!b_vector) n = b[b.size() - 1];
        a_batch.assign(a.begin(), a.end() - (a_vector ? 1 : 2));
        b_batch.assign(b.begin(), b.end() - (b_vector ? 1 : 2));
        const std::size_t rank = std::max(a_batch.size(), b_batch.size());
        batch.assign(rank, 1);
        for (std::size_t d = 0; d < rank; ++d) {
            const std::size_t ea = d + a_batch.size() < rank ? 1 : a_batch[d + a_batch.size() - rank];
            const std::size_t eb = d + b_batch.size() < rank ? 1 : b_batch[d + b_batch.size() - rank];
            if (ea != eb && ea != 1 && eb != 1) fail("the batch dimensions do not broadcast");
            batch[d] = ea == 1 ? eb : ea;
        }
        out = batch;
        if (!a_vector) out.push_back(m);
        if (!b_vector) out.push_back(n);
    }

    [[nodiscard]] std::size_t batch_count() const noexcept { return element_count(batch); }

    /// The index of batch `t` (row-major over `batch`) in an operand of batch shape `own`
    /// (right-aligned, extents of 1 broadcast).
    [[nodiscard]] std::size_t operand_batch(const std::vector<std::size_t>& own, std::size_t t) const noexcept
    {
        std::size_t index = 0, stride = 1;
        for (std::size_t d = batch.size(); d-- > 0;) {
            const std::size_t coordinate = t % batch[d];
            t /= batch[d];
            if (d + own.size() < batch.size()) break;  // this axis and those left of it: not the operand's
            const std::size_t extent = own[d + own.size() - batch.size()];
            if (extent != 1) index += coordinate * stride;
            stride *= extent;
        }
        return index;
    }
};

/// The raw data-domain products of every batch on Eigen's path (operands already in C), the
/// batches across threads, then the scales once over the whole result (finish). One function per
/// (NeedsAmax, R, C, P), whatever the operand types and strategy. TransposeA / TransposeB: each
/// batch of that operand is stored transposed (K x M, N x K; `s` describes the product), read in
/// place (the backward pass's g.b^T and a^T.g).
template <bool NeedsAmax, class R, class C, ScalePolicy P, bool TransposeA = false, bool TransposeB = false>
[[nodiscard]] ScaledArray<R, P> eigen_batched_matmul(const C* a, const C* b, const batched_shapes& s,
                                                     const scale_request& request, scale_rule rule)
{
    const std::size_t batches = s.batch_count(), m = s.m, k = s.k, n = s.n;
    // The batches across threads where they pay for it (a small model's per-head products do not:
    // under load each fork waits for a core).
    const bool fork = gemm_work_pays_fork(double(batches) * double(m) * double(n) * double(k));
    if constexpr (!NeedsAmax && std::same_as<R, C>) {
        // Static scale: natural / scale folds into each batch's GEMM alpha, written straight into
        // the result (as the 2-D product does: eigen_matmul).
        const float scale = static_matmul_scale<P>(request, rule);
        xt::xarray<R> data = xt::xarray<R>::from_shape(s.out);
        if (scale == 0.0f || request.natural == 0.0f || k == 0) {
            std::fill_n(data.data(), data.size(), C(0));
        } else {
            const auto alpha = static_cast<C>(double(request.natural) / double(scale));
            parallel_for(batches, fork, [&](std::size_t t) {
                gemm_any_thread_count<C, TransposeA, TransposeB>(a + s.operand_batch(s.a_batch, t) * m * k,
                                                                 b + s.operand_batch(s.b_batch, t) * k * n, m, k, n,
                                                                 data.data() + t * m * n, alpha);
            });
        }
        ScaledArray<R, P> result(std::move(data), request.natural == 0.0f ? 0.0f : scale);
        check_output("matmul", result);
        return result;
    }
    C* const raw = raw_product<C>(batches * m * n);
    if (k == 0) std::fill_n(raw, batches * m * n, C(0));
    else
        parallel_for(batches, fork, [&](std::size_t t) {
            // Each batch as a scale-1 product under natural scaling would compute: alpha 1, the
            // same GEMM call over the same operand values.
            gemm_any_thread_count<C, TransposeA, TransposeB>(a + s.operand_batch(s.a_batch, t) * m * k,
                                                             b + s.operand_batch(s.b_batch, t) * k * n, m, k, n,
                                                             raw + t * m * n, C(1));
        });
    return finish_matmul<NeedsAmax, R, C, P>(s.out, request, rule, raw);
}

/// matmul over leading batch dimensions (numpy's matmul), the product of each batch accumulated
/// by `gemm` (nullptr: Eigen's float32 GEMM) and the scales applied once over the whole result, so the
/// result has one scale and the same rule as a 2-D product of the same K. With a 2-D (or 1-D)
/// second operand every batch multiplies the same matrix: the batches' rows form one 2-D product
/// (a linear layer over a batch of sequences is one GEMM).
template <bool NeedsAmax, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto batched_matmul_with(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, scale_rule rule,
                                       tensor_core::grid_gemm_fn gemm)
{
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    using R = detail::out_or_t<Out, promote_t<A, B>>;
    using P = common_policy_t<PA, PB>;
    const batched_shapes s(a.shape(), b.shape());
    const std::size_t batches = s.batch_count(), m = s.m, k = s.k, n = s.n;
    if (s.b_batch.empty()) {
        std::optional<ScaledArray<B, PB>> column;  // a 1-D b as a (K, 1) matrix
        if (s.b_vector) column = scalify::reshape(b, {k, 1});
        std::optional<ScaledArray<A, PA>> row;  // a 1-D a as a (1, K) matrix; more axes are read as rows in place
        if (s.a_vector) row = scalify::reshape(a, {batches * m, k});
        return scalify::reshape(matmul_with<NeedsAmax, Out>(row ? *row : a, column ? *column : b, rule, no_buffer{}, gemm), s.out);
    }
    const scale_request request = matmul_request(a, b, k);
    if constexpr (std::same_as<C, float>) {
        if (gemm != nullptr) {
            // Each batch's raw product (the data product itself: scale-1 operands under natural
            // scaling), the batches across threads; the scales apply once, in finish.
            const float* pa = decoded<float>(a.data(), operand_panel<float, 0>());
            const float* pb = decoded<float>(b.data(), operand_panel<float, 1>());
            float* const raw = raw_product<float>(batches * m * n);
            parallel_for(batches, [&](std::size_t t) {
                gemm(pa + s.operand_batch(s.a_batch, t) * m * k, pb + s.operand_batch(s.b_batch, t) * k * n, m, k, n,
                     raw + t * m * n);
            });
            return finish_matmul<NeedsAmax, R, C, P>(s.out, request, rule, raw);
        }
    }
    return eigen_batched_matmul<NeedsAmax, R, C, P>(decoded<C>(a.data(), operand_panel<C, 0>()),
                                                    decoded<C>(b.data(), operand_panel<C, 1>()), s, request, rule);
}

/// a.b^T and a^T.b without materialising the transpose (matmul_vjp's two products).
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB,
          class Grids = typed_operands>
[[nodiscard]] auto matmul_transposed_b(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, Grids grids = {})
{
    return matmul_scoped<needs_amax_v<Strategy>, Out, false, true>(a, b, matmul_rule<Strategy, common_policy_t<PA, PB>>(),
                                                                    no_buffer{}, grids);
}
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB,
          class Grids = typed_operands>
[[nodiscard]] auto matmul_transposed_a(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, Grids grids = {})
{
    return matmul_scoped<needs_amax_v<Strategy>, Out, true, false>(a, b, matmul_rule<Strategy, common_policy_t<PA, PB>>(),
                                                                    no_buffer{}, grids);
}

/// numpy's matmul of operands on `grids` (see operand_grids), as scalify::matmul without a buffer.
template <class Strategy, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto matmul_on_grids(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, operand_grids grids)
{
    constexpr bool needs_amax = needs_amax_v<Strategy>;
    const auto rule = matmul_rule<Strategy, common_policy_t<PA, PB>>();
    if (a.dimension() == 2 && b.dimension() == 2) return matmul_scoped<needs_amax, Out>(a, b, rule, no_buffer{}, grids);
    return batched_matmul_with<needs_amax, Out>(a, b, rule, current_gemm<A, B>(grids));
}

}  // namespace detail

/// a times b as numpy's matmul: (M x K) times (K x N), and over leading batch dimensions, which
/// broadcast ((..., M, K) times (..., K, N)); a 1-D first operand is a row and a 1-D second one a
/// column, whose axis the result drops. One scale for the whole result, from the strategy's
/// matmul rule with the request's contraction K; shape_error naming both shapes when they do not
/// multiply. The optional third argument is a buffer for a 2-D result (its memory is reused when
/// it already holds M x N elements), typically the data of the previous result:
///     c = matmul(a, b, std::move(c).release_data());   // no allocation in a loop
/// The data-domain product accumulates as the thread's tensor_core::current_accumulation() says
/// (exact float32 outside any accumulation_scope) for the operand pairs a model covers.
template <class Strategy = default_scaling, class Out = void, class A, class PA, class B, class PB,
          class Buffer = detail::no_buffer>
    requires(!tensor_core::AccumulationModel<std::remove_cvref_t<Buffer>>)
[[nodiscard]] auto matmul(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, Buffer&& buffer = {})
{
    constexpr bool needs_amax = detail::needs_amax_v<Strategy>;
    const auto rule = detail::matmul_rule<Strategy, common_policy_t<PA, PB>>();
    if (a.dimension() == 2 && b.dimension() == 2) {
        return detail::matmul_scoped<needs_amax, Out>(a, b, rule, std::forward<Buffer>(buffer));
    }
    return detail::batched_matmul_with<needs_amax, Out>(a, b, rule, detail::current_gemm<A, B>());
}

/// matmul accumulating as Model says for this call, whatever the thread's scope:
///     auto y = matmul(x, w, tensor_core::h100_cublaslt_fp8{});
///     c = matmul(x, w, tensor_core::h100_cublaslt_fp8{}, std::move(c).release_data());
/// Operand pairs the model does not cover (tensor_core::operand_gemm) accumulate exactly.
template <class Strategy = default_scaling, class Out = void, tensor_core::AccumulationModel Model, class A, class PA,
          class B, class PB, class Buffer = detail::no_buffer>
[[nodiscard]] auto matmul(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, Model, Buffer&& buffer = {})
{
    constexpr tensor_core::grid_gemm_fn gemm = detail::model_gemm<Model, A, B>();
    constexpr bool needs_amax = detail::needs_amax_v<Strategy>;
    const auto rule = detail::matmul_rule<Strategy, common_policy_t<PA, PB>>();
    if (a.dimension() == 2 && b.dimension() == 2) {
        return detail::matmul_with<needs_amax, Out>(a, b, rule, std::forward<Buffer>(buffer), gemm);
    }
    return detail::batched_matmul_with<needs_amax, Out>(a, b, rule, gemm);
}

// ---- backward rule --------------------------------------------------------------------------

namespace detail {

/// The formats of matmul_vjp's three arrays (see operand_grids).
struct vjp_grids {
    dtype g = dtype::float32;
    dtype a = dtype::float32;
    dtype b = dtype::float32;
};

/// The grids of two of matmul_vjp's arrays, the first and second operand of one of its products.
[[nodiscard]] constexpr typed_operands grids_of(typed_operands, dtype vjp_grids::*, dtype vjp_grids::*) noexcept
{
    return {};
}
[[nodiscard]] constexpr operand_grids grids_of(const vjp_grids& grids, dtype vjp_grids::*first,
                                               dtype vjp_grids::*second) noexcept
{
    return {grids.*first, grids.*second};
}

/// numpy's matmul of typed operands: scalify::matmul.
template <class Strategy, class Out, class A, class PA, class B, class PB>
[[nodiscard]] auto matmul_on_grids(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b, typed_operands)
{
    return matmul<Strategy, Out>(a, b);
}

/// matmul_vjp of numpy's matmul (batched, broadcast, 1-D operands); only the gradients asked for
/// are formed (the others are left empty). A vector operand is its row (column) matrix; an
/// operand broadcast over batches gets the batches' gradients summed back (unbroadcast, whose
/// rule adds that sum to the product's contraction). With a 2-D second operand the batches' rows
/// form one 2-D product each way, as in the forward pass. Grids: typed_operands or vjp_grids.
/// Whether a product of M x K by K x N, and the two products of its backward pass, round the same
/// whether an operand is read transposed in place or from a transposed copy: the GEMM kernels pack
/// either layout into the same panels, but a product with one row or one column runs Eigen's
/// GEMV kernels (gemm_vector), whose two layouts sum in different orders. Where the BLAS runs the
/// products, also not below M + N + K = 20, where its small-matrix kernels need not pack.
[[nodiscard]] inline bool transposed_reads_keep_bits(std::size_t m, std::size_t k, std::size_t n) noexcept
{
    if (blas_runs_products() && m + n + k < 20) return false;
    return m > 1 && k > 1 && n > 1;
}

/// op(a) op(b) over batches on Eigen's path (or the BLAS's), an operand marked transposed read
/// as its last two axes swapped in place: the product matmul forms from the swapped copies
/// (wherever transposed_reads_keep_bits).
template <class Strategy, class Out, bool TransposeA, bool TransposeB, class A, class PA, class B, class PB>
[[nodiscard]] auto batched_product_transposed(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    using R = detail::out_or_t<Out, promote_t<A, B>>;
    using P = common_policy_t<PA, PB>;
    const auto logical = [](const auto& shape, bool transposed) {
        std::vector<std::size_t> out(shape.begin(), shape.end());
        if (transposed) std::swap(out[out.size() - 2], out[out.size() - 1]);
        return out;
    };
    const batched_shapes s(logical(a.shape(), TransposeA), logical(b.shape(), TransposeB));
    return eigen_batched_matmul<needs_amax_v<Strategy>, R, C, P, TransposeA, TransposeB>(
        decoded<C>(a.data(), operand_panel<C, 0>()), decoded<C>(b.data(), operand_panel<C, 1>()), s, matmul_request(a, b, s.k),
        matmul_rule<Strategy, P>());
}

template <class Strategy, class Out, class G, class PG, class A, class PA, class B, class PB, class Grids = typed_operands>
[[nodiscard]] auto batched_matmul_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b,
                                      bool need_a, bool need_b, Grids grids = {})
{
    const batched_shapes s(a.shape(), b.shape());
    if (!std::equal(g.shape().begin(), g.shape().end(), s.out.begin(), s.out.end())) {
        SCALIFY_THROW(shape_error(fmt::format("matmul_vjp: cotangent shape {} for the product of {} and {} (of shape {})",
                                              shape_string(g.shape()), shape_string(a.shape()), shape_string(b.shape()),
                                              shape_string(s.out))));
    }
    const std::size_t m = s.m, k = s.k, n = s.n;
    std::optional<ScaledArray<B, PB>> column;  // a 1-D b as a (K, 1) matrix
    if (s.b_vector) column = scalify::reshape(b, {k, 1});
    const ScaledArray<B, PB>& matrix_b = column ? *column : b;
    using GA = decltype(matmul_transposed_b<Strategy, Out>(g, b));
    using GB = decltype(matmul_transposed_a<Strategy, Out>(a, g));
    vjp_pair<GA, GB> result;
    const std::vector<std::size_t> a_shape(a.shape().begin(), a.shape().end());
    const std::vector<std::size_t> b_shape(b.shape().begin(), b.shape().end());
    if (s.b_batch.empty()) {
        // g and a of more than one axis are read as their rows in place (matmul_extents); g
        // lacks its N axis where b is a vector, and its M axis where a is one.
        const std::size_t rows = s.batch_count() * m;
        std::optional<ScaledArray<G, PG>> g_row;
        if (s.a_vector || s.b_vector) g_row = scalify::reshape(g, {rows, n});
        const ScaledArray<G, PG>& g_rows = g_row ? *g_row : g;
        if (need_a) result.first = scalify::reshape(matmul_transposed_b<Strategy, Out>(g_rows, matrix_b, grids_of(grids, &vjp_grids::g, &vjp_grids::b)), a_shape);
        if (need_b) {
            std::optional<ScaledArray<A, PA>> a_row;
            if (s.a_vector) a_row = scalify::reshape(a, {rows, k});
            result.second =
                scalify::reshape(matmul_transposed_a<Strategy, Out>(a_row ? *a_row : a, g_rows,
                                                       grids_of(grids, &vjp_grids::a, &vjp_grids::g)), b_shape);
        }
        return result;
    }
    std::vector<std::size_t> g_full = s.batch;
    g_full.insert(g_full.end(), {m, n});
    std::optional<ScaledArray<G, PG>> g_reshaped;  // only where g lacks an axis (a 1-D operand)
    if (!std::equal(g.shape().begin(), g.shape().end(), g_full.begin(), g_full.end())) g_reshaped = scalify::reshape(g, g_full);
    const ScaledArray<G, PG>& g_matrices = g_reshaped ? *g_reshaped : g;
    if (!s.a_vector && !s.b_vector && transposed_reads_keep_bits(m, k, n) &&
        current_gemm<G, B>(grids_of(grids, &vjp_grids::g, &vjp_grids::b)) == nullptr &&
        current_gemm<A, G>(grids_of(grids, &vjp_grids::a, &vjp_grids::g)) == nullptr) {
        // Eigen's or the BLAS's GEMM reads b and a transposed in place (no swapped copies): the
        // same packed panels, the same bits.
        if (need_a) {
            std::vector<std::size_t> own = s.a_batch;
            own.insert(own.end(), {m, k});
            result.first = scalify::reshape(
                unbroadcast<Strategy>(batched_product_transposed<Strategy, Out, false, true>(g_matrices, b), own), a_shape);
        }
        if (need_b) {
            std::vector<std::size_t> own = s.b_batch;
            own.insert(own.end(), {k, n});
            result.second = scalify::reshape(
                unbroadcast<Strategy>(batched_product_transposed<Strategy, Out, true, false>(a, g_matrices), own), b_shape);
        }
        return result;
    }
    if (need_a) {
        std::vector<std::size_t> own = s.a_batch;
        own.insert(own.end(), {m, k});
        auto full = matmul_on_grids<Strategy, Out>(g_matrices, swap_last_axes(matrix_b),
                                                   grids_of(grids, &vjp_grids::g, &vjp_grids::b));
        result.first = scalify::reshape(unbroadcast<Strategy>(std::move(full), own), a_shape);
    }
    if (need_b) {
        std::optional<ScaledArray<A, PA>> a_row;  // a 1-D a as a (1, K) matrix
        if (s.a_vector) a_row = scalify::reshape(a, {1, k});
        std::vector<std::size_t> own = s.b_batch;
        own.insert(own.end(), {k, n});
        auto full = matmul_on_grids<Strategy, Out>(swap_last_axes(a_row ? *a_row : a), g_matrices,
                                                   grids_of(grids, &vjp_grids::a, &vjp_grids::g));
        result.second = scalify::reshape(unbroadcast<Strategy>(std::move(full), own), b_shape);
    }
    return result;
}

}  // namespace detail

/// matmul_vjp's two products are matmuls, each divided by the square root of its own contraction
/// (fan-out for the input gradient, batch for the weight gradient) under default_scaling and
/// unit_scaling. That is Graphcore unit-scaling's *unconstrained* rule (constraint=None); its
/// default constraint, "to_output_scale", gives both gradients the forward scale 1/sqrt(K)
/// instead, because there a scale changes the computed value and the backward pass must stay the
/// gradient of the scaled forward pass. Here a scale never changes a value, so every gradient can
/// take its own.
///
///     auto [ga, gb] = matmul_vjp(g, a, b);   // g.b^T, a^T.g
///
/// y = a.b: ga = g.b^T, gb = a^T.g; for batched and 1-D operands as numpy's matmul (gradients of
/// broadcast operands summed over the batches they were broadcast to).
template <class Strategy = default_scaling, class Out = void, class G, class PG, class A, class PA, class B, class PB>
[[nodiscard]] auto matmul_vjp(const ScaledArray<G, PG>& g, const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    if (a.dimension() != 2 || b.dimension() != 2) return detail::batched_matmul_vjp<Strategy, Out>(g, a, b, true, true);
    auto ga = detail::matmul_transposed_b<Strategy, Out>(g, b);  // g.b^T, b read transposed in place
    auto gb = detail::matmul_transposed_a<Strategy, Out>(a, g);  // a^T.g
    return vjp_pair<decltype(ga), decltype(gb)>{std::move(ga), std::move(gb)};
}

}  // namespace scalify

#ifdef SCALIFY_SEPARATE_COMPILATION  // scalify::compiled holds these (detail/compiled_instances.hpp)
#include <scalify/detail/compiled_instances.hpp>
SCALIFY_GEMM_SLAB_INSTANCES(extern template, float)
SCALIFY_GEMM_SLAB_INSTANCES(extern template, double)
#endif
