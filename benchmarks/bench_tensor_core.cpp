// Tensor-core models side by side with Eigen's float GEMM on the same shape, in one run:
//   gemm<h100_cublaslt_fp8> / <h100_cublaslt_fp8_fast> on 256 x 1024 x 256 e4m3fn codes vs Eigen
//   sgemm on float copies of the same values (the target: within 10x of the peer);
//   the HMMA chain on f16 and bf16; b200_f8f6f4, AMX-BF16, AMX-FP16 and the CDNA units (MI250, MI300);
//   the B200's block-scaled GEMMs (MXFP8, NVFP4, MXFP4) through block_gemm;
//   a unit the lanes do not cover, on the reference engine;
//   scaled fp8 matmul with exact vs H100 accumulation at 512^3.
// Both sides use the same threads: OpenMP where the build found it (OMP_NUM_THREADS sets the
// count for Eigen and scalify alike), else one. docs/benchmarks.md has the figures:
//   OMP_NUM_THREADS=1 build/benchmarks/bench_tensor_core --benchmark_min_time=1
#include <scalify/scalify.hpp>

#include <benchmark/benchmark.h>

#include <cmath>
#include <random>

using namespace scalify;
namespace tc = scalify::tensor_core;

namespace {

constexpr std::size_t m = 256, k = 1024, n = 256;

template <class T>
xt::xarray<T> random_codes(std::size_t rows, std::size_t cols, unsigned seed)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 16.0f);  // well inside e4m3fn (448): no NaN codes
    auto x = xt::xarray<T>::from_shape({rows, cols});
    for (auto& e : x) e = T(normal(rng));
    return x;
}

template <class T>
xt::xarray<float> as_float(const xt::xarray<T>& x)
{
    auto out = xt::xarray<float>::from_shape(x.shape());
    for (std::size_t i = 0; i < x.size(); ++i) out.data()[i] = static_cast<float>(x.data()[i]);
    return out;
}

using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr auto flops = static_cast<std::int64_t>(2 * m * k * n);

/// The peer: Eigen's float GEMM on float copies of the same fp8 values, a new result per call as
/// gemm returns a new array.
void gemm_peer(benchmark::State& state)
{
    const auto a = as_float(random_codes<float8_e4m3fn>(m, k, 1));
    const auto b = as_float(random_codes<float8_e4m3fn>(k, n, 2));
    const Eigen::Map<const row_major> ma(a.data(), m, k), mb(b.data(), k, n);
    for (auto _ : state) {
        row_major c = ma * mb;
        benchmark::DoNotOptimize(c.data());
    }
    state.SetItemsProcessed(state.iterations() * flops);
}
BENCHMARK(gemm_peer)->Name("gemm_256x1024x256_peer_eigen_sgemm")->Unit(benchmark::kMillisecond);

template <class Model, class T>
void gemm_model(benchmark::State& state)
{
    const auto a = random_codes<T>(m, k, 1);
    const auto b = random_codes<T>(k, n, 2);
    for (auto _ : state) {
        auto c = tc::gemm<Model>(a, b);
        benchmark::DoNotOptimize(c.data());
    }
    state.SetItemsProcessed(state.iterations() * flops);
}
/// Registers gemm_model<tc::Model, T> as "gemm_256x1024x256_<type>_<Model>", in milliseconds.
#define GEMM_MODEL_BENCHMARK(Model, T, type) \
    BENCHMARK(gemm_model<tc::Model, T>)->Name("gemm_256x1024x256_" type "_" #Model)->Unit(benchmark::kMillisecond)
GEMM_MODEL_BENCHMARK(h100_cublaslt_fp8, float8_e4m3fn, "e4m3fn");
GEMM_MODEL_BENCHMARK(h100_cublaslt_fp8_fast, float8_e4m3fn, "e4m3fn");
GEMM_MODEL_BENCHMARK(h100_cublaslt_fp8, float8_e5m2, "e5m2");
GEMM_MODEL_BENCHMARK(h100_hmma_chain, Eigen::half, "f16");
GEMM_MODEL_BENCHMARK(h100_hmma_chain, Eigen::bfloat16, "bf16");

GEMM_MODEL_BENCHMARK(b200_f8f6f4_chain, float8_e4m3fn, "e4m3fn");
// The CPU and AMD units: chains of float32 FMAs (AMX), pairwise float32 adds (CDNA1/2) and the
// fused round-down unit (CDNA3), each in its own lanes.
GEMM_MODEL_BENCHMARK(amx_bf16_gemm, Eigen::bfloat16, "bf16");
GEMM_MODEL_BENCHMARK(amx_fp16_gemm, Eigen::half, "f16");
GEMM_MODEL_BENCHMARK(mi250_mfma_chain, Eigen::half, "f16");
GEMM_MODEL_BENCHMARK(mi300_mfma_chain, Eigen::half, "f16");
GEMM_MODEL_BENCHMARK(mi300_mfma_chain, float8_e4m3fnuz, "e4m3fnuz");

// The other named GEMM chains, so that every model's GEMM is timed against the same peer: the
// remaining NVIDIA units (their HMMA/QMMA lanes are the H100's with other F, P and K), the tf32
// chains on float data, AVX512_BF16, CDNA1 and CDNA3's bf16 and xf32 (double lanes).
GEMM_MODEL_BENCHMARK(v100_hmma_chain, Eigen::half, "f16");
GEMM_MODEL_BENCHMARK(a100_hmma_chain, Eigen::half, "f16");
GEMM_MODEL_BENCHMARK(ada_hmma_chain, Eigen::half, "f16");
GEMM_MODEL_BENCHMARK(b200_hmma_chain, Eigen::bfloat16, "bf16");
GEMM_MODEL_BENCHMARK(ada_qmma_chain, float8_e4m3fn, "e4m3fn");
GEMM_MODEL_BENCHMARK(b200_qmma_chain, float8_e4m3fn, "e4m3fn");
GEMM_MODEL_BENCHMARK(a100_tf32_chain, float, "f32");
GEMM_MODEL_BENCHMARK(ada_tf32_chain, float, "f32");
GEMM_MODEL_BENCHMARK(h100_tf32_chain, float, "f32");
GEMM_MODEL_BENCHMARK(b200_tf32_chain, float, "f32");
GEMM_MODEL_BENCHMARK(avx512_bf16_gemm, Eigen::bfloat16, "bf16");
GEMM_MODEL_BENCHMARK(mi100_mfma_chain, Eigen::half, "f16");
GEMM_MODEL_BENCHMARK(mi300_mfma_chain, Eigen::bfloat16, "bf16");
GEMM_MODEL_BENCHMARK(mi300_mfma_chain, float, "f32");

/// Block-scaled GEMMs (B200 kind::mxf8f6f4 and kind::mxf4nvf4) through block_gemm: the same
/// values, scales of one binade around 1 (E8M0) or UE4M3 scales in [1, 2).
template <class Model, class T>
void block_gemm_model(benchmark::State& state)
{
    using I = typename Model::instruction;
    using S = typename I::scale_type;
    constexpr std::size_t B = I::scale_block;
    const auto a = random_codes<T>(m, k, 1);
    const auto b = random_codes<T>(k, n, 2);
    std::mt19937 rng(3);
    auto sa = xt::xarray<S>::from_shape({m, k / B});
    auto sb = xt::xarray<S>::from_shape({k / B, n});
    for (auto& x : sa) x = S(std::ldexp(1.0f + static_cast<float>(rng() % 8) / 8, static_cast<int>(rng() % 3) - 1));
    for (auto& x : sb) x = S(std::ldexp(1.0f + static_cast<float>(rng() % 8) / 8, static_cast<int>(rng() % 3) - 1));
    for (auto _ : state) {
        auto c = tc::block_gemm<Model>(a, sa, b, sb);
        benchmark::DoNotOptimize(c.data());
    }
    state.SetItemsProcessed(state.iterations() * flops);
}
BENCHMARK(block_gemm_model<tc::b200_mxf8f6f4_chain, float8_e4m3fn>)
    ->Name("gemm_256x1024x256_e4m3fn_b200_mxf8f6f4_chain")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(block_gemm_model<tc::b200_nvfp4_chain, float4_e2m1fn>)
    ->Name("gemm_256x1024x256_e2m1fn_b200_nvfp4_chain")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(block_gemm_model<tc::b200_mxf4_chain, float4_e2m1fn>)
    ->Name("gemm_256x1024x256_e2m1fn_b200_mxf4_chain")
    ->Unit(benchmark::kMillisecond);

/// A unit the lanes do not cover (round-to-nearest alignment and normalisation): every output on
/// the reference engine, as a user-described unit or out-of-range bf16 data runs.
struct nearest_qgmma : tc::inner_product_model<13, 14, 32, tc::any_pair_of<float8_e4m3fn, float8_e5m2>,
                                               tc::inner_product_rules<tc::product_exponent::nominal,
                                                                       rounding_mode::nearest_even,
                                                                       rounding_mode::nearest_even>> {
    static constexpr const char* name = "nearest_qgmma";
};
struct nearest_gemm : tc::gemm_model<nearest_qgmma, 4> {
    static constexpr const char* name = "nearest_gemm";
};

void gemm_reference_engine(benchmark::State& state)
{
    constexpr std::size_t rows = 64, columns = 64;
    const auto a = random_codes<float8_e4m3fn>(rows, k, 1);
    const auto b = random_codes<float8_e4m3fn>(k, columns, 2);
    for (auto _ : state) {
        auto c = tc::gemm<nearest_gemm>(a, b);
        benchmark::DoNotOptimize(c.data());
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(2 * rows * k * columns));
}
BENCHMARK(gemm_reference_engine)->Name("gemm_64x1024x64_e4m3fn_reference_engine")->Unit(benchmark::kMillisecond);

/// One instruction, one output: the reference engine (what dot<> runs).
void dot_qgmma(benchmark::State& state)
{
    const auto a = random_codes<float8_e4m3fn>(1, 32, 3);
    const auto b = random_codes<float8_e4m3fn>(1, 32, 4);
    float c = 1.0f;
    for (auto _ : state) {
        c = tc::dot<tc::h100_qgmma>(std::span<const float8_e4m3fn>(a.data(), 32), std::span<const float8_e4m3fn>(b.data(), 32),
                                    c * 0x1p-10f);
        benchmark::DoNotOptimize(c);
    }
    state.SetItemsProcessed(state.iterations() * 32);
}
BENCHMARK(dot_qgmma)->Name("dot_h100_qgmma_k32_reference_engine")->Unit(benchmark::kNanosecond);

/// Scaled matmul 512^3, fp8 x fp8, float result: the default exact path and the H100 models.
template <class Model>
void scaled_matmul(benchmark::State& state)
{
    constexpr std::size_t dim = 512;
    const auto a = make_scaled_array<pow2_scale>(random_codes<float8_e4m3fn>(dim, dim, 5), 0.5f);
    const auto b = make_scaled_array<pow2_scale>(random_codes<float8_e4m3fn>(dim, dim, 6), 0.25f);
    for (auto _ : state) {
        auto c = matmul<default_scaling, float>(a, b, Model{});
        benchmark::DoNotOptimize(c.data().data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * dim * dim * dim);
}
BENCHMARK(scaled_matmul<tc::exact_accumulation>)->Name("matmul_e4m3fn_512_accumulate_exact")->Unit(benchmark::kMillisecond);
BENCHMARK(scaled_matmul<tc::h100_cublaslt_fp8>)->Name("matmul_e4m3fn_512_accumulate_h100")->Unit(benchmark::kMillisecond);
BENCHMARK(scaled_matmul<tc::h100_cublaslt_fp8_fast>)
    ->Name("matmul_e4m3fn_512_accumulate_h100_fast")
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
