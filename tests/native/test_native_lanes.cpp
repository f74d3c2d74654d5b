// The tensor-core GEMM lanes as this machine's CPU runs them. The unit tests run in the sanitizer
// tree, built for the baseline x86-64 (SSE2): the lanes' AVX2 and AVX-512 forms (the CDNA joins,
// the rounding-toward-zero conversion of the NVIDIA lanes) only run where the code is compiled
// for a CPU that has them. This file is compiled as the examples are (SCALIFY_NATIVE: for the
// building machine) and checks every lane path against gemm_dot, the reference chain, bit for bit.
#include "../support/gemm_reference.hpp"

#include <scalify/tensor_core.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

using namespace scalify;
namespace tc = scalify::tensor_core;

namespace native_lanes {

using scalify::testing::from_code;
using scalify::testing::same_result;

/// mode 0: N(0,1) times 2^[-20, 20); 1: any code (NaN, inf, subnormals); 2: tiny, 2^[-140, -100);
/// 3: wide, 2^[-60, 70) (bf16 and float past the lanes' exponent range).
template <class T>
T drawn(std::mt19937& rng, int mode)
{
    std::normal_distribution<float> normal;
    if (mode == 1) return from_code<T>(static_cast<std::uint32_t>(rng()));
    const int low = mode == 2 ? -140 : mode == 3 ? -60 : -20, high = mode == 2 ? -101 : mode == 3 ? 69 : 19;
    return T(std::ldexp(normal(rng), std::uniform_int_distribution<int>(low, high)(rng)));
}

/// Random GEMMs of Model on (TA, TB) operands against gemm_dot, over pairs of modes: M = 5 (two
/// row pairs and one more), N = 40 (a block of 32 lanes and a part), K = 37 and 100 (a padded last
/// instruction; chains of many blocks).
template <class Model, class TA, class TB>
void check_model(std::mt19937& rng)
{
    constexpr int mode_pairs[][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 2}, {0, 2}, {3, 3}, {3, 0}};
    for (const std::size_t k : {std::size_t{37}, std::size_t{100}}) {
        for (const auto& [mode_a, mode_b] : mode_pairs) {
            const std::size_t m = 5, n = 40;
            xt::xarray<TA> a = xt::xarray<TA>::from_shape({m, k});
            xt::xarray<TB> b = xt::xarray<TB>::from_shape({k, n});
            // Random codes at one place in four, N(0,1) elsewhere, so that most rows and columns
            // stay on the lanes.
            for (auto& x : a) x = drawn<TA>(rng, mode_a == 1 && rng() % 4 != 0 ? 0 : mode_a);
            for (auto& x : b) x = drawn<TB>(rng, mode_b == 1 && rng() % 4 != 0 ? 0 : mode_b);
            const std::size_t agreeing =
                scalify::testing::outputs_agreeing_with_gemm_dot<Model>(tc::gemm<Model>(a, b), a, b, same_result);
            CAPTURE(Model::name, k, mode_a, mode_b);
            CHECK(agreeing == m * n);
        }
    }
}

}  // namespace native_lanes

TEST_CASE("native lanes: the CDNA GEMMs give the reference chain's bits", "[tensor_core][native]")
{
    using namespace native_lanes;
    std::mt19937 rng(20261126);
    check_model<tc::mi100_mfma_chain, Eigen::half, Eigen::half>(rng);
    check_model<tc::mi100_mfma_chain, Eigen::bfloat16, Eigen::bfloat16>(rng);
    check_model<tc::mi250_mfma_chain, Eigen::half, Eigen::half>(rng);
    check_model<tc::mi250_mfma_chain, Eigen::bfloat16, Eigen::bfloat16>(rng);
    check_model<tc::mi300_mfma_chain, Eigen::half, Eigen::half>(rng);
    check_model<tc::mi300_mfma_chain, Eigen::bfloat16, Eigen::bfloat16>(rng);
    check_model<tc::mi300_mfma_chain, float, float>(rng);
    check_model<tc::mi300_mfma_chain, float8_e4m3fnuz, float8_e4m3fnuz>(rng);
    check_model<tc::mi300_mfma_chain, float8_e5m2fnuz, float8_e4m3fnuz>(rng);
}

TEST_CASE("native lanes: the NVIDIA and AMX GEMMs give the reference chain's bits", "[tensor_core][native]")
{
    using namespace native_lanes;
    std::mt19937 rng(20261127);
    check_model<tc::h100_cublaslt_fp8, float8_e4m3fn, float8_e5m2>(rng);
    check_model<tc::h100_hmma_chain, Eigen::half, Eigen::half>(rng);
    check_model<tc::h100_hmma_chain, Eigen::bfloat16, Eigen::bfloat16>(rng);
    check_model<tc::v100_hmma_chain, Eigen::half, Eigen::half>(rng);
    check_model<tc::a100_tf32_chain, float, float>(rng);
    check_model<tc::b200_f8f6f4_chain, float8_e4m3fn, float8_e4m3fn>(rng);
    check_model<tc::amx_bf16_gemm, Eigen::bfloat16, Eigen::bfloat16>(rng);
}
