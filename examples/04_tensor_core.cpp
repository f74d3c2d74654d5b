// What an H100 tensor core does to a long fp8 dot product, and how scalify reproduces it: one
// 4096-term dot product of positive e4m3 values summed exactly, in float32 on the CPU, by the
// cuBLASLt FP8 GEMM with its default accumulation (QGMMA chains of 128 terms promoted into a
// float32 total) and with use_fast_accum=True (one QGMMA chain: every partial sum cut to 14
// significant bits, toward zero). Then the rule on one instruction, and the same models inside a
// scaled matmul, chosen by name as a command-line flag would choose them.
#include <scalify/scalify.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

using namespace scalify;
namespace tc = scalify::tensor_core;

namespace {

/// Positive e4m3fn values from a fixed integer sequence (the same on every platform): codes
/// 0x30..0x5f, i.e. 0.5 to 15.
std::vector<float8_e4m3fn> positive_values(std::size_t n, std::uint32_t seed)
{
    std::vector<float8_e4m3fn> out(n);
    for (auto& x : out) {
        seed = seed * 1664525u + 1013904223u;
        x = float8_e4m3fn::from_bits(static_cast<std::uint8_t>(0x30 + (seed >> 24) % 0x30));
    }
    return out;
}

}  // namespace

int main()
{
    constexpr std::size_t length = 4096;
    const auto a = positive_values(length, 1);
    const auto b = positive_values(length, 2);

    fmt::print("One dot product of {} positive e4m3 products:\n", length);
    fmt::print("{:>6} | {:>16} | {:>24} | {:>24} | {:>24}\n", "K", "exact", "float32 loop", "h100_cublaslt_fp8",
               "h100_cublaslt_fp8_fast");
    for (const std::size_t k : {32u, 128u, 512u, 1024u, 4096u}) {
        double exact = 0;
        float loop = 0;
        for (std::size_t i = 0; i < k; ++i) {
            const double product = static_cast<double>(a[i]) * static_cast<double>(b[i]);
            exact += product;  // exact: every partial sum is an integer multiple of 2^-6 below 2^53
            loop += static_cast<float>(a[i]) * static_cast<float>(b[i]);
        }
        const std::span<const float8_e4m3fn> ak(a.data(), k), bk(b.data(), k);
        const float promoted = tc::gemm_dot<tc::h100_cublaslt_fp8>(ak, bk);
        const float fast = tc::gemm_dot<tc::h100_cublaslt_fp8_fast>(ak, bk);
        const auto cell = [exact](float x) { return fmt::format("{:>12} ({:+.1e})", x, (x - exact) / exact); };
        fmt::print("{:>6} | {:>16} | {:>24} | {:>24} | {:>24}\n", k, exact, cell(loop), cell(promoted), cell(fast));
    }

    fmt::print("\nWhy: one QGMMA instruction (K = 32) aligns every term to the largest exponent, keeps\n"
               "13 bits below it (each term cut toward zero), sums exactly, then cuts to 14 bits:\n");
    std::vector<float8_e5m2> x(32), y(32);
    x[0] = y[0] = float8_e5m2(1.0f);
    x[1] = y[1] = float8_e5m2(0x1p-7f);  // 1 + 2^-14: the small product falls below 2^-13
    const std::vector<float8_e5m2> zeros(32);
    fmt::print("  1*1 + 2^-7*2^-7, C = 0    -> {:<8} (float32: {})\n", tc::dot<tc::h100_qgmma>(x, y, 0.0f), 1.0f + 0x1p-14f);
    fmt::print("  no products, C = 1+2^-20  -> {:<8} (the accumulator is cut too)\n",
               tc::dot<tc::h100_qgmma>(zeros, zeros, 1.0f + 0x1p-20f));
    fmt::print("  no products, C = 4097     -> {:<8} (13 significant bits: kept)\n", tc::dot<tc::h100_qgmma>(zeros, zeros, 4097.0f));
    fmt::print("  no products, C = 16385    -> {:<8} (15 significant bits: cut to 14)\n",
               tc::dot<tc::h100_qgmma>(zeros, zeros, 16385.0f));

    // The same in a scaled matmul: a row of a and a column of b, scales 2^-3 and 2^-2.
    auto row = xt::xarray<float8_e4m3fn>::from_shape({1, length});
    auto column = xt::xarray<float8_e4m3fn>::from_shape({length, 1});
    std::copy(a.begin(), a.end(), row.begin());
    std::copy(b.begin(), b.end(), column.begin());
    const auto sa = make_scaled_array<pow2_scale>(row, 0.125f);
    const auto sb = make_scaled_array<pow2_scale>(column, 0.25f);
    double total = 0;
    for (std::size_t i = 0; i < length; ++i) total += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    total *= 0.125 * 0.25;
    fmt::print("\nmatmul of the same vectors as ScaledArrays (scales 2^-3, 2^-2; exact {}), by --accumulate:\n", total);
    for (const char* name : {"exact", "h100", "h100-fast"}) {
        const tc::accumulation_scope<> scope(name);  // what a command-line flag would select
        const float value = matmul<natural_scaling, float>(sa, sb).value()(0, 0);
        const double error = std::abs(value - total) / total;
        // The exact mode's last bits depend on Eigen's summation order (SIMD width): print a bound.
        if (tc::current_accumulation() == tc::accumulation::exact) fmt::print("  {:<9} relative error < 1e-6: {}\n", name, error < 1e-6);
        else fmt::print("  {:<9} {} ({:+.1e})\n", name, value, (value - total) / total);
    }
}
