// libFuzzer target: the tensor-core models on fuzzer-chosen shapes and codes (NaN, inf, zeros,
// subnormals included) and accumulators (any float32 bit pattern). Checked properties, not just
// "no crash": gemm equals a loop of gemm_dot (the reference chain) bit for bit, whichever path
// (vectorised lanes or reference engine) it takes; a one-instruction gemm_dot equals dot with
// C = 0; dot is NaN exactly when IEEE says so, and otherwise within the model's error bound of the
// exact sum; shapes that do not fit are shape_errors.
#include "fuzz_support.hpp"

#include <scalify/scalify.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <concepts>
#include <cstdlib>
#include <algorithm>
#include <limits>
#include <span>
#include <vector>

namespace fuzz_tensor_core {

using namespace scalify;
namespace tc = scalify::tensor_core;

namespace {

using fuzz::fail;
using fuzz::reader;

template <class T>
T read_element(reader& in)
{
    using storage = typename float_traits<T>::format::storage_type;
    unsigned code = in.byte();
    if constexpr (sizeof(storage) == 2) code = code << 8 | in.byte();
    return float_traits<T>::from_bits(static_cast<storage>(code));
}

bool same_bits(float x, float y) { return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y); }

/// gemm against gemm_dot on an m x k x n problem.
template <class Model, class TA, class TB>
void check_gemm(reader& in)
{
    const std::size_t m = in.byte() % 7, n = in.byte() % 41;
    const std::size_t k = (std::size_t{in.byte()} << 8 | in.byte()) % 301;
    auto a = xt::xarray<TA>::from_shape({m, k});
    auto b = xt::xarray<TB>::from_shape({k, n});
    for (auto& x : a) x = read_element<TA>(in);
    for (auto& x : b) x = read_element<TB>(in);
    const xt::xarray<float> d = tc::gemm<Model>(a, b);
    if (d.dimension() != 2 || d.shape()[0] != m || d.shape()[1] != n) fail("gemm result is m x n");
    std::vector<TA> row(k);
    std::vector<TB> column(k);
    for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t p = 0; p < k; ++p) row[p] = a(i, p);
        for (std::size_t j = 0; j < n; ++j) {
            for (std::size_t p = 0; p < k; ++p) column[p] = b(p, j);
            if (!same_bits(d(i, j), tc::gemm_dot<Model>(row, column))) fail("gemm == loop of gemm_dot");
        }
    }
    if (k == Model::instruction::k && m > 0 && n > 0) {
        for (std::size_t p = 0; p < k; ++p) column[p] = b(p, 0);
        for (std::size_t p = 0; p < k; ++p) row[p] = a(0, p);
        if (!same_bits(d(0, 0), tc::dot<typename Model::instruction>(row, column, 0.0f))) fail("one-step gemm == dot");
    }
}

/// One instruction with a fuzzed accumulator: NaN exactly when IEEE says so; otherwise within
/// (K + 1) cuts of 2^(emax - F) and one cut of P bits of the exact sum.
template <class Model, class TA, class TB>
void check_dot(reader& in)
{
    constexpr std::size_t K = Model::k;
    std::vector<TA> a(K);
    std::vector<TB> b(K);
    for (auto& x : a) x = read_element<TA>(in);
    for (auto& x : b) x = read_element<TB>(in);
    const float c = in.any_float();
    const float d = tc::dot<Model>(a, b, c);

    const float inf = std::numeric_limits<float>::infinity();
    bool nan = std::isnan(c);
    bool plus = c == inf;
    bool minus = c == -inf;
    double exact = std::isfinite(c) ? static_cast<double>(c) : 0.0;
    double largest = std::isfinite(c) ? std::abs(static_cast<double>(c)) : 0.0;
    // The alignment exponent is taken from nominal exponents: a subnormal operand counts at its
    // format's smallest normal exponent, so a product of subnormals can sit far below 2^emax
    // (found by the fuzzer: f16 subnormals under h100_hmma). emax bounds the cuts.
    const auto nominal = [](double v, int min_exponent) { return std::max(std::ilogb(v), min_exponent); };
    int emax = std::isfinite(c) && c != 0.0f ? std::ilogb(c) : std::numeric_limits<int>::min();
    for (std::size_t i = 0; i < K; ++i) {
        const double x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
        if (std::isnan(x) || std::isnan(y) || (std::isinf(x) && y == 0) || (std::isinf(y) && x == 0)) nan = true;
        else if ((std::isinf(x) || std::isinf(y)) && std::signbit(x) != std::signbit(y)) minus = true;
        else if (std::isinf(x) || std::isinf(y)) plus = true;
        else {
            exact += x * y;  // not exact in every case; the bound below has room for it
            largest = std::max(largest, std::abs(x * y));
            if (x != 0 && y != 0) {
                emax = std::max(emax, nominal(x, std::numeric_limits<TA>::min_exponent - 1) +
                                          nominal(y, std::numeric_limits<TB>::min_exponent - 1) + 1);
            }
        }
    }
    nan = nan || (plus && minus);
    if (nan != std::isnan(d)) fail("dot is NaN exactly when an input is NaN, inf * 0 or inf - inf");
    if (nan) {
        if (std::bit_cast<std::uint32_t>(d) != 0x7fffffffu) fail("dot's NaN is the canonical 0x7fffffff");
        return;
    }
    if (plus || minus) {
        if (d != (plus ? inf : -inf)) fail("an infinite term wins");
        return;
    }
    if (largest == 0) {
        if (std::bit_cast<std::uint32_t>(d) != 0u) fail("no nonzero term gives +0");
        return;
    }
    if (std::isinf(d)) {
        if (std::abs(exact) < 0x1p127) fail("dot overflows only near 2^128");
        return;
    }
    // Each cut < 2^(emax - F), emax at most max(floor(log2 largest), the nominal emax above).
    const double unit = std::ldexp(1.0, std::max(std::ilogb(largest), emax) - Model::alignment_bits);
    const double bound = static_cast<double>(K + 1) * unit + std::ldexp(std::abs(exact) + (K + 1) * unit, 1 - Model::result_bits) +
                         static_cast<double>(K + 1) * std::ldexp(largest, -52) + 0x1p-149;  // double's own sum error
    if (std::abs(static_cast<double>(d) - exact) > bound) fail("dot within its error bound of the exact sum");
}

template <class TA, class TB>
void check_fp8_pair(reader& in)
{
    switch (in.byte() % 4) {
    case 0: check_gemm<tc::h100_cublaslt_fp8, TA, TB>(in); check_dot<tc::h100_qgmma, TA, TB>(in); break;
    case 1: check_gemm<tc::h100_cublaslt_fp8_fast, TA, TB>(in); check_dot<tc::h100_qgmma, TA, TB>(in); break;
    case 2: check_gemm<tc::ada_qmma_chain, TA, TB>(in); check_dot<tc::ada_qmma, TA, TB>(in); break;
    default: check_gemm<tc::b200_qmma_chain, TA, TB>(in); check_dot<tc::b200_qmma, TA, TB>(in); break;
    }
}

template <class Chain, class T>
void check_16bit_on(reader& in)
{
    check_gemm<Chain, T, T>(in);
    check_dot<typename Chain::instruction, T, T>(in);
}

template <class T>
void check_16bit(reader& in)
{
    switch (in.byte() % 8) {
    case 0: check_16bit_on<tc::h100_hmma_chain, T>(in); break;
    case 1: check_16bit_on<tc::a100_hmma_chain, T>(in); break;
    case 2: check_16bit_on<tc::ada_hmma_chain, T>(in); break;
    case 3: check_16bit_on<tc::b200_hmma_chain, T>(in); break;
    // The units of other engines (chained FMAs, CDNA lanes): gemm against the loop of gemm_dot.
    case 4: check_gemm<tc::mi300_mfma_chain, T, T>(in); break;
    case 5: check_gemm<tc::mi250_mfma_chain, T, T>(in); break;
    case 6:
        if constexpr (std::same_as<T, Eigen::half>) check_gemm<tc::amx_fp16_gemm, T, T>(in);
        else check_gemm<tc::amx_bf16_gemm, T, T>(in);
        break;
    default:
        if constexpr (std::same_as<T, Eigen::half>) check_16bit_on<tc::v100_hmma_chain, T>(in);
        else check_16bit_on<tc::h100_hmma_chain, T>(in);
        break;
    }
}

void check_shapes(reader& in)
{
    const std::size_t ra = in.byte() % 4, rb = in.byte() % 4;
    std::vector<std::size_t> sa(ra), sb(rb);
    for (auto& e : sa) e = in.byte() % 5;
    for (auto& e : sb) e = in.byte() % 5;
    const auto a = xt::xarray<float8_e4m3fn>::from_shape(sa);
    const auto b = xt::xarray<float8_e5m2>::from_shape(sb);
    const bool fits = ra == 2 && rb == 2 && sa[1] == sb[0];
    try {
        const auto d = tc::gemm<tc::h100_cublaslt_fp8>(a, b);
        if (!fits) fail("mismatched shapes are a shape_error");
        for (float x : d)
            if (std::bit_cast<std::uint32_t>(x) != 0u) fail("zero operands give +0");
    } catch (const shape_error&) {
        if (fits) fail("fitting shapes are accepted");
    }
    std::vector<float8_e4m3fn> x(in.byte() % 40), y(in.byte() % 40);
    try {
        (void)tc::dot<tc::h100_qgmma>(x, y, 0.0f);
        if (x.size() != 32 || y.size() != 32) fail("dot takes exactly K elements");
    } catch (const shape_error&) {
        if (x.size() == 32 && y.size() == 32) fail("dot accepts K elements");
    }
}

}  // namespace

/// The target's body; fuzz_tensor_core's LLVMFuzzerTestOneInput (generated) calls it.
int test_one_input(const std::uint8_t* data, std::size_t size)
{
    reader in{data, size};
    switch (in.byte() % 7) {
    case 0: check_fp8_pair<float8_e4m3fn, float8_e4m3fn>(in); break;
    case 1: check_fp8_pair<float8_e4m3fn, float8_e5m2>(in); break;
    case 2: check_fp8_pair<float8_e5m2, float8_e4m3fn>(in); break;
    case 3: check_fp8_pair<float8_e5m2, float8_e5m2>(in); break;
    case 4: check_16bit<Eigen::half>(in); break;
    case 5: check_16bit<Eigen::bfloat16>(in); break;
    default: check_shapes(in); break;
    }
    return 0;
}

}  // namespace fuzz_tensor_core
