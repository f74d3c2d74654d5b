// tensor_core: the H100 models against the vendored capture (tests/data/mma/), the rules on hand-
// made cases, non-finite input and bad shapes, gemm against loops of dot, and matmul's
// accumulation model (per call, scoped, nested, run-time, inherited by matmul_vjp).
#include <scalify/scalify.hpp>

#include "../support/mma_capture.hpp"
#include "../support/gemm_reference.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace scalify;
namespace tc = scalify::tensor_core;

namespace {

const std::string data_dir = std::string(SCALIFY_TEST_DATA_DIR) + "/mma/";

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

/// A QGMMA operand list of 32 e5m2 values: `values` first, zeros after.
std::array<float8_e5m2, 32> e5m2_terms(std::initializer_list<float> values)
{
    std::array<float8_e5m2, 32> out{};
    std::size_t i = 0;
    for (float v : values) {
        out[i] = float8_e5m2(v);
        REQUIRE(static_cast<float>(out[i]) == v);  // the cases below use exact values only
        ++i;
    }
    return out;
}

/// Random codes of T over finite values, with a share of zeros and, if asked, NaN/inf codes.
template <class T>
T random_element(std::mt19937& rng, bool specials)
{
    using format = typename float_traits<T>::format;
    std::uniform_int_distribution<unsigned> code(0, (1u << format::total_bits) - 1);
    std::uniform_int_distribution<int> pick(0, 15);
    for (;;) {
        if (pick(rng) == 0) return float_traits<T>::from_bits(0);
        const T x = mma_capture::from_code<T>(code(rng));
        const float f = static_cast<float>(x);
        if (std::isfinite(f) || specials) return x;
    }
}

template <class T>
xt::xarray<T> random_matrix(std::size_t rows, std::size_t cols, std::mt19937& rng, bool specials = false)
{
    auto x = xt::xarray<T>::from_shape({rows, cols});
    for (auto& e : x) e = random_element<T>(rng, specials);
    return x;
}

/// gemm<Model> against gemm_dot<Model> (the reference chain) output by output, and the GEMM over
/// float32 copies of the operands read on their formats' grids (a precision scope's path)
/// against gemm<Model>, bit for bit.
template <class Model, class TA, class TB>
void check_gemm_against_dot(std::size_t m, std::size_t k, std::size_t n, unsigned seed, bool specials)
{
    std::mt19937 rng(seed);
    const auto a = random_matrix<TA>(m, k, rng, specials);
    const auto b = random_matrix<TB>(k, n, rng, specials);
    const xt::xarray<float> d = tc::gemm<Model>(a, b);
    REQUIRE(d.shape()[0] == m);
    REQUIRE(d.shape()[1] == n);
    const std::size_t mismatches = m * n - scalify::testing::outputs_agreeing_with_gemm_dot<Model>(d, a, b);
    const xt::xarray<float> a_values = xt::cast<float>(a), b_values = xt::cast<float>(b);
    std::vector<float> on_grid(m * n, -1.0f);
    tc::detail::gemm_into_on_grid<Model, TA, TB>(a_values.data(), b_values.data(), m, k, n, on_grid.data());
    std::size_t grid_mismatches = 0;
    for (std::size_t i = 0; i < m * n; ++i) grid_mismatches += bits(on_grid[i]) == bits(d.data()[i]) ? 0 : 1;
    INFO(Model::name << " " << m << "x" << k << "x" << n << " seed " << seed << (specials ? " with NaN/inf" : ""));
    CHECK(mismatches == 0);
    CHECK(grid_mismatches == 0);
}

}  // namespace

// Units that differ from the H100 in one rule each (F = 13; P = 24 shows the alignment alone).
struct nominal_unit : tc::inner_product_model<13, 24, 32, tc::any_pair_of<float8_e5m2>> {
    static constexpr const char* name = "nominal_unit";
};
struct normalised_unit : tc::inner_product_model<13, 24, 32, tc::any_pair_of<float8_e5m2>,
                                                 tc::inner_product_rules<tc::product_exponent::normalised>> {
    static constexpr const char* name = "normalised_unit";
};
struct rne_unit : tc::inner_product_model<13, 14, 32, tc::any_pair_of<float8_e5m2>,
                                          tc::inner_product_rules<tc::product_exponent::nominal, rounding_mode::nearest_even,
                                                                  rounding_mode::nearest_even>> {
    static constexpr const char* name = "rne_unit";
};

// ---- the capture ------------------------------------------------------------------------------

TEST_CASE("dot<h100_qgmma> and dot<h100_hmma> reproduce every vendored H100 tile output", "[tensor_core][capture]")
{
    const char* files[] = {"wgmma_e4m3_e4m3.bin", "wgmma_e4m3_e5m2.bin", "wgmma_e5m2_e4m3.bin",
                           "wgmma_e5m2_e5m2.bin", "mma_f16.bin",         "mma_bf16.bin"};
    for (const char* name : files) {
        const auto file = mma_capture::read_tile_file(data_dir + name);
        REQUIRE(file.tiles >= 20);  // every input class, several tiles each
        const auto per_class = mma_capture::match_tiles(file);
        for (std::size_t c = 0; c < per_class.size(); ++c) {
            INFO(name << ", class " << mma_capture::class_names[c]);
            CHECK(per_class[c].outputs > 0);
            CHECK(per_class[c].equal == per_class[c].outputs);
        }
    }
}

TEST_CASE("gemm<h100_cublaslt_fp8> and gemm<h100_cublaslt_fp8_fast> reproduce every vendored cuBLASLt output",
          "[tensor_core][capture]")
{
    std::size_t records = 0;
    for (const char* name : {"gemm_k32.bin", "gemm_long.bin"}) {
        for (const auto& record : mma_capture::read_gemm_file(data_dir + name)) {
            const auto match = mma_capture::match_gemm(record);
            INFO(record.header);
            CHECK(match.fast0.equal == match.fast0.outputs);
            CHECK(match.fast1.equal == match.fast1.outputs);
            ++records;
        }
    }
    CHECK(records == 25);  // K = 32 .. 4096, codes/normal/wide/positive
}

TEST_CASE("matmul with the H100 models reproduces cuBLASLt's scaled FP8 GEMM, scales included", "[tensor_core][matmul]")
{
    // The tests/data/gemm vectors: D = (A.B) * 0.75 * 0.125 through torch._scaled_mm.
    struct vector_file {
        const char* name;
        bool a_e5m2;
    };
    for (const vector_file v : {vector_file{"scaled_mm_e4m3fnxe4m3fn_64x256x128.txt", false},
                                vector_file{"scaled_mm_e5m2xe4m3fn_64x256x128.txt", true}}) {
        std::ifstream in(std::string(SCALIFY_TEST_DATA_DIR) + "/gemm/" + v.name);
        REQUIRE(in.good());
        std::size_t m = 0, k = 0, n = 0;
        float scale_a = 1, scale_b = 1;
        std::vector<unsigned> a_codes, bt_codes;
        std::map<std::string, std::vector<std::uint32_t>> outputs;
        std::string line, current;
        while (std::getline(in, line)) {
            if (line.empty() || line[0] == '#') continue;
            std::istringstream words(line);
            std::string key, hex;
            words >> key;
            if (key == "M") words >> m;
            else if (key == "K") words >> k;
            else if (key == "N") words >> n;
            else if (key == "scale_a") words >> scale_a;
            else if (key == "scale_b") words >> scale_b;
            else if (key == "A" || key == "BT")
                while (words >> hex) (key == "A" ? a_codes : bt_codes).push_back(static_cast<unsigned>(std::stoul(hex, nullptr, 16)));
            else if (key == "out") words >> current;
            else if (!current.empty()) {
                std::istringstream all(line);
                while (all >> hex) outputs[current].push_back(static_cast<std::uint32_t>(std::stoul(hex, nullptr, 16)));
            }
        }
        auto b = xt::xarray<float8_e4m3fn>::from_shape({k, n});
        for (std::size_t j = 0; j < n; ++j)
            for (std::size_t p = 0; p < k; ++p) b(p, j) = float8_e4m3fn::from_bits(static_cast<std::uint8_t>(bt_codes[j * k + p]));
        const auto sb = make_scaled_array(b, scale_b);
        const auto check = [&](const auto& sa) {
            const auto d0 = matmul<natural_scaling, float>(sa, sb, tc::h100_cublaslt_fp8{}).value();
            const auto d1 = matmul<natural_scaling, float>(sa, sb, tc::h100_cublaslt_fp8_fast{}).value();
            std::size_t equal0 = 0, equal1 = 0;
            for (std::size_t i = 0; i < m * n; ++i) {
                equal0 += bits(d0.data()[i]) == outputs.at("float32_fast0")[i] ? 1 : 0;
                equal1 += bits(d1.data()[i]) == outputs.at("float32_fast1")[i] ? 1 : 0;
            }
            INFO(v.name);
            CHECK(equal0 == m * n);
            CHECK(equal1 == m * n);
        };
        if (v.a_e5m2) {
            auto a = xt::xarray<float8_e5m2>::from_shape({m, k});
            for (std::size_t i = 0; i < m * k; ++i) a.data()[i] = float8_e5m2::from_bits(static_cast<std::uint8_t>(a_codes[i]));
            check(make_scaled_array(a, scale_a));
        } else {
            auto a = xt::xarray<float8_e4m3fn>::from_shape({m, k});
            for (std::size_t i = 0; i < m * k; ++i) a.data()[i] = float8_e4m3fn::from_bits(static_cast<std::uint8_t>(a_codes[i]));
            check(make_scaled_array(a, scale_a));
        }
    }
}

// ---- the rules on hand-made cases ---------------------------------------------------------------

TEST_CASE("QGMMA cuts every term to 2^(emax - 13) before an exact sum", "[tensor_core][rules]")
{
    const auto ones = e5m2_terms({1, 1, 1, 1, 1, 1});
    // 1*1 + 2^-7 * 2^-7: the small product lies below 2^-13 and vanishes, though float32 holds the sum.
    CHECK(tc::dot<tc::h100_qgmma>(e5m2_terms({1, 0x1p-7f}), e5m2_terms({1, 0x1p-7f}), 0.0f) == 1.0f);
    // Two such products sum to 2^-13, but each is cut on its own first.
    CHECK(tc::dot<tc::h100_qgmma>(e5m2_terms({1, 0x1p-7f, 0x1p-7f}), e5m2_terms({1, 0x1p-7f, 0x1p-7f}), 0.0f) == 1.0f);
    // 2^-13 itself survives the alignment: 1 + 2^-13 has 14 significant bits.
    CHECK(tc::dot<tc::h100_qgmma>(e5m2_terms({1, 0x1p-6f}), e5m2_terms({1, 0x1p-7f}), 0.0f) == 1.0f + 0x1p-13f);
    // 2 + 2^-13 needs 15 bits: the normalisation cuts it to 14, toward zero.
    CHECK(tc::dot<tc::h100_qgmma>(e5m2_terms({1, 1, 0x1p-6f}), e5m2_terms({1, 1, 0x1p-7f}), 0.0f) == 2.0f);
    // Toward zero in sign-magnitude: -(1 + 2^-14 + ...) becomes -1, not -(1 + 2^-13).
    CHECK(tc::dot<tc::h100_qgmma>(e5m2_terms({-1, 0x1p-7f}), e5m2_terms({1, -0x1p-7f}), 0.0f) == -1.0f);
    // Six ones: exact small integers come out exact.
    CHECK(tc::dot<tc::h100_qgmma>(ones, ones, 10.0f) == 16.0f);
}

TEST_CASE("QGMMA: the accumulator joins the alignment and is cut too", "[tensor_core][rules]")
{
    const auto zeros = e5m2_terms({});
    // Products all zero: C alone, cut to 14 significant bits.
    CHECK(tc::dot<tc::h100_qgmma>(zeros, zeros, 1.0f + 0x1p-20f) == 1.0f);
    CHECK(tc::dot<tc::h100_qgmma>(zeros, zeros, 1.0f + 0x1p-13f + 0x1p-14f) == 1.0f + 0x1p-13f);
    CHECK(tc::dot<tc::h100_qgmma>(zeros, zeros, -3.0f - 0x1p-20f) == -3.0f);
    // A large C sets emax: products below 2^(emax - 13) vanish.
    CHECK(tc::dot<tc::h100_qgmma>(e5m2_terms({1}), e5m2_terms({1}), 0x1p14f) == 0x1p14f);
    CHECK(tc::dot<tc::h100_qgmma>(e5m2_terms({2}), e5m2_terms({1}), 0x1p14f) == 0x1p14f + 2.0f);
}

TEST_CASE("Products keep their nominal exponent (not renormalised)", "[tensor_core][rules]")
{
    // 1.5 * 1.5 = 2.25 has nominal exponent 0; a renormalising unit would align to 2^1.
    const auto a = e5m2_terms({1.5f, 0x1p-6f});
    const auto b = e5m2_terms({1.5f, 0x1p-7f});
    CHECK(tc::dot<nominal_unit>(a, b, 0.0f) == 2.25f + 0x1p-13f);
    CHECK(tc::dot<normalised_unit>(a, b, 0.0f) == 2.25f);
    // The H100 is the nominal kind: the same case, cut to 14 bits at the end.
    CHECK(tc::dot<tc::h100_qgmma>(a, b, 0.0f) == 2.25f);
}

TEST_CASE("A model's cuts may round to nearest even instead", "[tensor_core][rules]")
{
    const auto zeros = e5m2_terms({});
    // 1 + 3 * 2^-15: toward zero gives 1, nearest (to 2^-13) gives 1 + 2^-13.
    CHECK(tc::dot<tc::h100_qgmma>(zeros, zeros, 1.0f + 3 * 0x1p-15f) == 1.0f);
    CHECK(tc::dot<rne_unit>(zeros, zeros, 1.0f + 3 * 0x1p-15f) == 1.0f + 0x1p-13f);
    // C = 2 + 3 * 2^-13 aligns to units of 2^-12: 1.5 units, a tie (to even: 2) or cut to 1.
    CHECK(tc::dot<rne_unit>(zeros, zeros, 2.0f + 3 * 0x1p-13f) == 2.0f + 0x1p-11f);
    CHECK(tc::dot<tc::h100_qgmma>(zeros, zeros, 2.0f + 3 * 0x1p-13f) == 2.0f + 0x1p-12f);
}

TEST_CASE("Signed zeros: a zero sum is +0", "[tensor_core][rules]")
{
    const auto zeros = e5m2_terms({});
    CHECK(bits(tc::dot<tc::h100_qgmma>(zeros, zeros, 0.0f)) == 0u);
    CHECK(bits(tc::dot<tc::h100_qgmma>(zeros, zeros, -0.0f)) == 0u);
    CHECK(bits(tc::dot<tc::h100_qgmma>(e5m2_terms({-0.0f, 0.0f}), e5m2_terms({1, -1}), -0.0f)) == 0u);
    CHECK(bits(tc::dot<tc::h100_qgmma>(e5m2_terms({1, -1}), e5m2_terms({2, 2}), 0.0f)) == 0u);
    CHECK(bits(tc::dot<tc::h100_qgmma>(e5m2_terms({1}), e5m2_terms({-2}), 2.0f)) == 0u);
}

TEST_CASE("HMMA: F = 25, P = 24; bf16 results overflow to inf and underflow onto the subnormal grid",
          "[tensor_core][rules]")
{
    std::array<Eigen::half, 16> ha{}, hb{};
    ha[0] = Eigen::half(1.0f);
    hb[0] = Eigen::half(1.0f);
    // 1 + 2^-24: the alignment keeps 2^(0 - 25) multiples, the normalisation 24 bits: cut.
    CHECK(tc::dot<tc::h100_hmma>(ha, hb, 0x1p-24f) == 1.0f);
    ha[1] = Eigen::half(0x1p-12f);
    hb[1] = Eigen::half(0x1p-11f);
    CHECK(tc::dot<tc::h100_hmma>(ha, hb, 0.0f) == 1.0f + 0x1p-23f);

    std::array<Eigen::bfloat16, 16> a{}, b{};
    a[0] = Eigen::bfloat16(0x1p127f);
    b[0] = Eigen::bfloat16(2.0f);
    CHECK(tc::dot<tc::h100_hmma>(a, b, 0.0f) == std::numeric_limits<float>::infinity());
    b[0] = Eigen::bfloat16(-2.0f);
    CHECK(tc::dot<tc::h100_hmma>(a, b, 0.0f) == -std::numeric_limits<float>::infinity());
    // (127/64)^2 * 2^-146 = 31.5 * 2^-149: cut toward zero onto the subnormal grid.
    a[0] = Eigen::bfloat16(0x1.fcp-126f);
    b[0] = Eigen::bfloat16(0x1.fcp-20f);
    REQUIRE(static_cast<float>(a[0]) == 0x1.fcp-126f);
    CHECK(bits(tc::dot<tc::h100_hmma>(a, b, 0.0f)) == 31u);
    b[0] = Eigen::bfloat16(-0x1.fcp-20f);
    CHECK(bits(tc::dot<tc::h100_hmma>(a, b, 0.0f)) == (0x80000000u | 31u));
}

TEST_CASE("Non-finite input: NaN in gives NaN, inf * 0 and inf - inf give NaN, inf otherwise wins",
          "[tensor_core][special]")
{
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const auto is_canonical_nan = [](float x) { return bits(x) == 0x7fffffffu; };
    const auto ones = e5m2_terms({1, 1});
    auto with_inf = e5m2_terms({1, 1});
    with_inf[1] = float8_e5m2::from_bits(0x7c);  // +inf
    auto with_minus_inf = e5m2_terms({1, 1});
    with_minus_inf[1] = float8_e5m2::from_bits(0xfc);
    auto with_nan = e5m2_terms({1, 1});
    with_nan[1] = float8_e5m2::from_bits(0x7e);
    const auto zero_second = e5m2_terms({1, 0});

    CHECK(is_canonical_nan(tc::dot<tc::h100_qgmma>(with_nan, ones, 0.0f)));
    CHECK(is_canonical_nan(tc::dot<tc::h100_qgmma>(with_nan, e5m2_terms({}), 0.0f)));  // NaN * 0
    CHECK(is_canonical_nan(tc::dot<tc::h100_qgmma>(ones, ones, nan)));
    CHECK(is_canonical_nan(tc::dot<tc::h100_qgmma>(with_inf, zero_second, 0.0f)));  // inf * 0
    CHECK(tc::dot<tc::h100_qgmma>(with_inf, with_minus_inf, 0.0f) == -inf);  // 1 + inf * -inf
    CHECK(tc::dot<tc::h100_qgmma>(with_inf, ones, 0.0f) == inf);
    CHECK(tc::dot<tc::h100_qgmma>(with_minus_inf, ones, 5.0f) == -inf);
    CHECK(is_canonical_nan(tc::dot<tc::h100_qgmma>(with_inf, ones, -inf)));  // +inf product, C = -inf
    CHECK(tc::dot<tc::h100_qgmma>(ones, ones, -inf) == -inf);
    // inf - inf among the products.
    auto a = e5m2_terms({1, 1});
    a[0] = float8_e5m2::from_bits(0x7c);
    a[1] = float8_e5m2::from_bits(0xfc);
    CHECK(is_canonical_nan(tc::dot<tc::h100_qgmma>(a, ones, 0.0f)));
    // e4m3fn has NaN codes and no inf.
    std::array<float8_e4m3fn, 32> e4{};
    e4[3] = float8_e4m3fn::from_bits(0xff);
    CHECK(is_canonical_nan(tc::dot<tc::h100_qgmma>(e4, e4, 1.0f)));
}

TEST_CASE("Bad input: spans and shapes that do not fit are shape_errors naming the sizes", "[tensor_core][errors]")
{
    const std::vector<float8_e4m3fn> a31(31), a32(32), a33(33);
    REQUIRE_THROWS_AS(tc::dot<tc::h100_qgmma>(a31, a32, 0.0f), shape_error);
    REQUIRE_THROWS_WITH(tc::dot<tc::h100_qgmma>(a32, a33, 0.0f), Catch::Contains("32 and 33") && Catch::Contains("K = 32"));
    REQUIRE_THROWS_WITH(tc::gemm_dot<tc::h100_cublaslt_fp8>(a31, a32), Catch::Contains("31 and 32"));
    const auto m23 = xt::xarray<float8_e4m3fn>::from_shape({2, 3});
    const auto m45 = xt::xarray<float8_e4m3fn>::from_shape({4, 5});
    const auto v4 = xt::xarray<float8_e4m3fn>::from_shape({4});
    REQUIRE_THROWS_WITH(tc::gemm<tc::h100_cublaslt_fp8>(m23, m45), Catch::Contains("(2, 3)") && Catch::Contains("(4, 5)"));
    REQUIRE_THROWS_AS(tc::gemm<tc::h100_cublaslt_fp8_fast>(v4, m45), shape_error);
    // The span form takes exact-length spans as they are.
    CHECK(tc::dot<tc::h100_qgmma>(std::span<const float8_e4m3fn>(a32), std::span<const float8_e4m3fn>(a32), 2.0f) == 2.0f);
}

TEST_CASE("Zero-size gemm: M or N of 0 is an empty result, K of 0 gives +0", "[tensor_core][errors]")
{
    const auto empty_rows = tc::gemm<tc::h100_cublaslt_fp8>(xt::xarray<float8_e4m3fn>::from_shape({0, 5}),
                                                            xt::xarray<float8_e4m3fn>::from_shape({5, 3}));
    CHECK(empty_rows.shape()[0] == 0);
    CHECK(empty_rows.shape()[1] == 3);
    const auto no_k = tc::gemm<tc::h100_cublaslt_fp8_fast>(xt::xarray<float8_e5m2>::from_shape({2, 0}),
                                                           xt::xarray<float8_e4m3fn>::from_shape({0, 3}));
    REQUIRE(no_k.size() == 6);
    for (float x : no_k) CHECK(bits(x) == 0u);
    CHECK(bits(tc::gemm_dot<tc::h100_cublaslt_fp8>(std::vector<float8_e4m3fn>{}, std::vector<float8_e4m3fn>{})) == 0u);
}

TEST_CASE("gemm equals a loop of gemm_dot (the reference chain) for every pair, shape and non-finite code",
          "[tensor_core][gemm]")
{
    // Shapes off the 32-wide lanes and the 32-long instructions, K across promotions.
    check_gemm_against_dot<tc::h100_cublaslt_fp8, float8_e4m3fn, float8_e4m3fn>(7, 300, 45, 1, false);
    check_gemm_against_dot<tc::h100_cublaslt_fp8_fast, float8_e4m3fn, float8_e4m3fn>(7, 300, 45, 2, false);
    check_gemm_against_dot<tc::h100_cublaslt_fp8, float8_e5m2, float8_e5m2>(5, 513, 33, 3, false);
    check_gemm_against_dot<tc::h100_cublaslt_fp8_fast, float8_e4m3fn, float8_e5m2>(3, 129, 70, 4, false);
    check_gemm_against_dot<tc::h100_cublaslt_fp8, float8_e5m2, float8_e4m3fn>(9, 31, 1, 5, false);
    check_gemm_against_dot<tc::h100_cublaslt_fp8, float8_e5m2, float8_e5m2>(6, 200, 40, 6, true);
    check_gemm_against_dot<tc::h100_cublaslt_fp8_fast, float8_e4m3fn, float8_e4m3fn>(6, 200, 40, 7, true);
    // 16-bit: f16 runs the lanes; bf16 codes over the whole range the reference engine.
    check_gemm_against_dot<tc::h100_hmma_chain, Eigen::half, Eigen::half>(5, 100, 37, 8, false);
    check_gemm_against_dot<tc::h100_hmma_chain, Eigen::half, Eigen::half>(5, 50, 37, 9, true);
    check_gemm_against_dot<tc::h100_hmma_chain, Eigen::bfloat16, Eigen::bfloat16>(4, 70, 9, 10, true);
    // Operands big enough (M K + K N >= 2^15) that the lanes decode them on the threads.
    check_gemm_against_dot<tc::h100_cublaslt_fp8, float8_e4m3fn, float8_e5m2>(40, 600, 70, 17, true);
    check_gemm_against_dot<tc::h100_hmma_chain, Eigen::half, Eigen::half>(37, 500, 30, 18, true);
    check_gemm_against_dot<tc::h100_cublaslt_fp8_fast, float8_e4m3fn, float8_e4m3fn>(33, 520, 40, 19, true);
    // More pairs for the path over float32 values on the formats' grids.
    check_gemm_against_dot<tc::h100_cublaslt_fp8_fast, float8_e5m2, float8_e5m2>(6, 200, 40, 12, true);
    check_gemm_against_dot<tc::h100_cublaslt_fp8, float8_e4m3fn, float8_e4m3fn>(6, 200, 40, 13, true);
    check_gemm_against_dot<tc::h100_hmma_chain, Eigen::bfloat16, Eigen::bfloat16>(4, 70, 9, 16, false);
    // b200_qmma (F = 40, the sum rounded to nearest even): terms in float, sums in double lanes.
    // e5m2 products span 2^-32 to 2^31, so terms and the accumulator are cut; K off 32.
    check_gemm_against_dot<tc::b200_qmma_chain, float8_e5m2, float8_e5m2>(7, 1031, 37, 20, false);
    check_gemm_against_dot<tc::b200_qmma_chain, float8_e4m3fn, float8_e5m2>(5, 300, 45, 21, true);
    check_gemm_against_dot<tc::b200_qmma_chain, float8_e5m2, float8_e4m3fn>(9, 31, 1, 22, false);
    check_gemm_against_dot<tc::b200_qmma_chain, float8_e4m3fn, float8_e4m3fn>(33, 520, 40, 23, true);
    check_gemm_against_dot<tc::b200_qmma_chain, float8_e5m2, float8_e5m2>(40, 600, 70, 24, true);
    // Finite e4m3 codes: the uncut path (products within F = 40 bits of a large accumulator) in
    // every block of columns, the aligned terms where the accumulator grows past 2^22.
    check_gemm_against_dot<tc::b200_qmma_chain, float8_e4m3fn, float8_e4m3fn>(6, 1000, 70, 25, false);
}

TEST_CASE("b200_qmma_chain's lanes round ties to even and cut terms toward zero, on both paths", "[tensor_core][gemm]")
{
    // 128 products of 2^16 make 2^23, 1 x 1 makes the accumulator odd (2^23 + 1, last place 1), and
    // 0.5 x 1 in a later instruction is a tie: to even, 2^23 + 2 (a half rounded down would keep
    // 2^23 + 1). Row 1 has no 1 x 1: 2^23 + 0.5 stays 2^23. Without `cut`, the products of these
    // e4m3 data keep every bit within F = 40 bits of the accumulator (the uncut path). With it,
    // -2^-9 x 2^-9 = -2^-18 joins the tie: half a unit of 2^(23 - 40), cut to nothing (rounded, it
    // would take the tie down to 2^23 + 1), and the data's floor (2^-18 and, for e5m2, 2^-32)
    // sends every instruction to the aligned terms. Each output also against gemm_dot; 37 columns.
    const auto check = [](auto type_tag, bool cut, float tiny) {
        using T = decltype(type_tag);
        constexpr std::size_t k = 224, n = 37;
        auto a = xt::xarray<T>::from_shape({2, k});
        auto b = xt::xarray<T>::from_shape({k, n});
        a.fill(T(0.0f));
        b.fill(T(0.0f));
        for (std::size_t p = 0; p < 128; ++p) a(0, p) = a(1, p) = T(256.0f);
        a(0, 128) = T(1.0f);
        a(0, 160) = a(1, 160) = T(0.5f);
        if (cut) a(0, 161) = a(1, 161) = T(-0x1p-9f);
        a(0, 200) = a(1, 200) = T(tiny);
        for (std::size_t j = 0; j < n; ++j) {
            for (std::size_t p = 0; p < k; ++p) b(p, j) = T(1.0f);
            for (std::size_t p = 0; p < 128; ++p) b(p, j) = T(256.0f);
            b(161, j) = T(0x1p-9f);
            b(200, j) = T(tiny);
        }
        const xt::xarray<float> d = tc::gemm<tc::b200_qmma_chain>(a, b);
        const std::size_t mismatches = 2 * n - scalify::testing::outputs_agreeing_with_gemm_dot<tc::b200_qmma_chain>(d, a, b);
        INFO((cut ? "with" : "without") << " the cut term, tiny " << tiny);
        CHECK(mismatches == 0);
        for (std::size_t j = 0; j < n; ++j) {
            CHECK(d(0, j) == 0x1p23f + 2.0f);
            CHECK(d(1, j) == 0x1p23f);
        }
    };
    check(float8_e4m3fn{}, false, 0.125f);
    check(float8_e4m3fn{}, true, 0.125f);
    check(float8_e5m2{}, false, 0x1p-16f);
    check(float8_e5m2{}, true, 0x1p-16f);
}

TEST_CASE("an accumulation table has no GEMM for a pair the GPU has no unit for", "[tensor_core][gemm]")
{
    const tc::gemm_table& h100 = tc::detail::gemm_table_of<tc::accumulation::h100, false>;
    CHECK(h100(dtype::float8_e4m3fn, dtype::float16).run == nullptr);
    CHECK(h100(dtype::float32, dtype::float32).run == nullptr);  // tf32 only when asked for
    CHECK(std::string_view(h100(dtype::float8_e5m2, dtype::float8_e4m3fn).model) == "h100_cublaslt_fp8");
    CHECK(std::string_view(h100(dtype::bfloat16, dtype::bfloat16).model) == "h100_hmma_chain");
    CHECK(tc::detail::gemm_table_for(tc::accumulation::exact) == nullptr);
    CHECK(tc::detail::gemm_table_for(tc::accumulation::h100) == &h100);
}

TEST_CASE("bf16 gemm runs the lanes where the data keep results in float32's normal range", "[tensor_core][gemm]")
{
    std::mt19937 rng(12);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> binade(-40, 40);
    const auto bf16_matrix = [&](std::size_t rows, std::size_t cols) {
        auto x = xt::xarray<Eigen::bfloat16>::from_shape({rows, cols});
        for (auto& e : x) e = Eigen::bfloat16(std::ldexp(normal(rng), binade(rng)));
        return x;
    };
    auto a = bf16_matrix(6, 200);
    auto b = bf16_matrix(200, 35);
    const auto check = [&] {
        const xt::xarray<float> d = tc::gemm<tc::h100_hmma_chain>(a, b);
        return 6 * 35 - scalify::testing::outputs_agreeing_with_gemm_dot<tc::h100_hmma_chain>(d, a, b);
    };
    CHECK(check() == 0);  // exponents within +-45: the lanes
    a(3, 7) = Eigen::bfloat16(0x1p100f);  // products up to 2^145: out of range, the reference engine
    b(9, 2) = Eigen::bfloat16(0x1p60f);
    CHECK(check() == 0);
    a(3, 7) = Eigen::bfloat16(0x1p-120f);  // products down to 2^-165: out of range too
    CHECK(check() == 0);

    // In range (exponent sums of -101), a chain whose accumulator falls below 2^(F - 126) = 2^-101
    // and then meets products that are all zero: it stays as it is.
    auto x = xt::xarray<Eigen::bfloat16>::from_shape({1, 32});
    auto y = xt::xarray<Eigen::bfloat16>::from_shape({32, 1});
    x.fill(Eigen::bfloat16(0.0f));
    y.fill(Eigen::bfloat16(0.0f));
    x(0, 0) = Eigen::bfloat16(0x1p-50f);
    x(0, 1) = Eigen::bfloat16(-0x1.02p-50f);
    y(0, 0) = y(1, 0) = Eigen::bfloat16(0x1p-51f);
    float lanes = 0.0f;
    CHECK(tc::detail::gemm_lanes<tc::h100_hmma_chain>(x.data(), y.data(), 1, 32, 1, &lanes));
    CHECK(bits(lanes) == bits(-0x1p-108f));
    CHECK(bits(tc::gemm<tc::h100_hmma_chain>(x, y)(0, 0)) == bits(-0x1p-108f));
}

TEST_CASE("Fast accumulation drifts on long positive sums; promotion every 128 holds it", "[tensor_core][gemm]")
{
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uniform(0.0f, 100.0f);
    std::vector<float8_e4m3fn> a(4096), b(4096);
    double exact = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        a[i] = float8_e4m3fn(uniform(rng));
        b[i] = float8_e4m3fn(uniform(rng));
        exact += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    }
    const double promoted = tc::gemm_dot<tc::h100_cublaslt_fp8>(a, b);
    const double fast = tc::gemm_dot<tc::h100_cublaslt_fp8_fast>(a, b);
    CHECK(std::abs(promoted - exact) / exact < 2e-3);
    CHECK((exact - fast) / exact > 1e-2);  // biased low: every step cuts toward zero at 14 bits
}

TEST_CASE("Model tags are closed by concepts", "[tensor_core][static]")
{
    STATIC_REQUIRE(tc::InnerProductModel<tc::h100_qgmma>);
    STATIC_REQUIRE(tc::InnerProductModel<tc::h100_hmma>);
    STATIC_REQUIRE(!tc::InnerProductModel<tc::h100_cublaslt_fp8>);
    STATIC_REQUIRE(!tc::InnerProductModel<int>);
    STATIC_REQUIRE(tc::GemmModel<tc::h100_cublaslt_fp8>);
    STATIC_REQUIRE(tc::GemmModel<tc::h100_cublaslt_fp8_fast>);
    STATIC_REQUIRE(!tc::GemmModel<tc::h100_qgmma>);
    STATIC_REQUIRE(tc::AccumulationModel<tc::exact_accumulation>);
    STATIC_REQUIRE(!tc::AccumulationModel<float>);
    STATIC_REQUIRE(tc::InnerProductModelFor<tc::h100_qgmma, float8_e4m3fn, float8_e5m2>);
    STATIC_REQUIRE(!tc::InnerProductModelFor<tc::h100_qgmma, float8_e4m3fn, Eigen::half>);
    STATIC_REQUIRE(tc::InnerProductModelFor<tc::h100_hmma, Eigen::bfloat16, Eigen::bfloat16>);
    STATIC_REQUIRE(!tc::InnerProductModelFor<tc::h100_hmma, Eigen::half, Eigen::bfloat16>);
    STATIC_REQUIRE(std::same_as<tc::operand_gemm_t<tc::h100_cublaslt_fp8, Eigen::half, Eigen::half>, tc::h100_hmma_chain>);
    STATIC_REQUIRE(std::same_as<tc::operand_gemm_t<tc::h100_cublaslt_fp8, float, float>, void>);
    STATIC_REQUIRE(std::same_as<tc::operand_gemm_t<tc::exact_accumulation, float8_e4m3fn, float8_e4m3fn>, void>);
    // Which pairs run the vectorised lanes (the rest, the reference engine).
    STATIC_REQUIRE(tc::detail::lane_fit<tc::h100_qgmma, float8_e4m3fn, float8_e5m2>::usable);
    STATIC_REQUIRE(tc::detail::lane_fit<tc::h100_qgmma, float8_e5m2, float8_e5m2>::always_in_range);
    STATIC_REQUIRE(std::same_as<tc::detail::lane_plan<tc::h100_qgmma>::wide, float>);
    STATIC_REQUIRE(tc::detail::lane_fit<tc::h100_hmma, Eigen::half, Eigen::half>::usable);
    STATIC_REQUIRE(tc::detail::lane_fit<tc::h100_hmma, Eigen::half, Eigen::half>::always_in_range);
    STATIC_REQUIRE(tc::detail::lane_fit<tc::h100_hmma, Eigen::bfloat16, Eigen::bfloat16>::usable);
    STATIC_REQUIRE(!tc::detail::lane_fit<tc::h100_hmma, Eigen::bfloat16, Eigen::bfloat16>::always_in_range);
    STATIC_REQUIRE(!tc::detail::lane_fit<rne_unit, float8_e5m2, float8_e5m2>::usable);
}

// ---- matmul's accumulation model ------------------------------------------------------------------

namespace {

template <class T>
ScaledArray<T> scaled_random(std::size_t rows, std::size_t cols, unsigned seed, float scale)
{
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(0.0f, 64.0f);  // positive: fast accumulation shows
    auto x = xt::xarray<T>::from_shape({rows, cols});
    for (auto& e : x) e = T(uniform(rng));
    return make_scaled_array(x, scale);
}

bool same_bits(const xt::xarray<float>& x, const xt::xarray<float>& y)
{
    if (x.shape() != y.shape()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
        if (bits(x.data()[i]) != bits(y.data()[i])) return false;
    return true;
}

}  // namespace

TEST_CASE("matmul: exact by default, a tag per call, the data product through gemm then the scales",
          "[tensor_core][matmul]")
{
    const auto a = scaled_random<float8_e4m3fn>(8, 1024, 1, 0.5f);
    const auto b = scaled_random<float8_e4m3fn>(1024, 6, 2, 0.25f);
    CHECK(tc::current_accumulation() == tc::accumulation::exact);
    const auto exact = matmul<natural_scaling, float>(a, b).value();
    CHECK(same_bits(exact, matmul<natural_scaling, float>(a, b, tc::exact_accumulation{}).value()));

    const auto promoted = matmul<natural_scaling, float>(a, b, tc::h100_cublaslt_fp8{});
    const auto fast = matmul<natural_scaling, float>(a, b, tc::h100_cublaslt_fp8_fast{});
    CHECK(same_bits(promoted.data(), tc::gemm<tc::h100_cublaslt_fp8>(a.data(), b.data())));
    CHECK(same_bits(fast.data(), tc::gemm<tc::h100_cublaslt_fp8_fast>(a.data(), b.data())));
    CHECK(promoted.scale() == 0.125f);
    CHECK(!same_bits(fast.value(), exact));

    // Every strategy and output type: the model's product, then the same rescale as the exact path.
    const auto rescaled = matmul<default_scaling>(a, b, tc::h100_cublaslt_fp8_fast{});
    CHECK(rescaled.scale() == matmul<default_scaling>(a, b).scale());
    const auto dynamic = matmul<dynamic_abs<float8_e4m3fn>, float8_e4m3fn>(a, b, tc::h100_cublaslt_fp8{});
    CHECK(dynamic.shape()[0] == 8);
    CHECK(dynamic.shape()[1] == 6);
}

TEST_CASE("matmul: the buffer argument works with and without a model", "[tensor_core][matmul]")
{
    const auto a = scaled_random<float8_e5m2>(4, 64, 3, 1.0f);
    const auto b = scaled_random<float8_e4m3fn>(64, 5, 4, 1.0f);
    auto c = matmul<natural_scaling, float>(a, b, tc::h100_cublaslt_fp8_fast{});
    const float* memory = c.data().data();
    const xt::xarray<float> first = c.data();
    c = matmul<natural_scaling, float>(a, b, tc::h100_cublaslt_fp8_fast{}, std::move(c).release_data());
    CHECK(c.data().data() == memory);
    CHECK(same_bits(c.data(), first));
    {
        const tc::accumulation_scope<tc::h100_cublaslt_fp8_fast> scope;
        c = matmul<natural_scaling, float>(a, b, std::move(c).release_data());
    }
    CHECK(c.data().data() == memory);
    CHECK(same_bits(c.data(), first));
}

TEST_CASE("accumulation_scope: thread-local, nestable, restored on exceptions, run-time form",
          "[tensor_core][matmul][scope]")
{
    const auto a = scaled_random<float8_e4m3fn>(3, 512, 5, 1.0f);
    const auto b = scaled_random<float8_e4m3fn>(512, 4, 6, 1.0f);
    const auto exact = matmul<natural_scaling, float>(a, b).data();
    const auto promoted = matmul<natural_scaling, float>(a, b, tc::h100_cublaslt_fp8{}).data();
    const auto fast = matmul<natural_scaling, float>(a, b, tc::h100_cublaslt_fp8_fast{}).data();
    REQUIRE(!same_bits(promoted, fast));
    {
        const tc::accumulation_scope<tc::h100_cublaslt_fp8> outer;
        CHECK(tc::current_accumulation() == tc::accumulation::h100);
        CHECK(same_bits(matmul<natural_scaling, float>(a, b).data(), promoted));
        {
            const tc::accumulation_scope<tc::h100_cublaslt_fp8_fast> inner;
            CHECK(same_bits(matmul<natural_scaling, float>(a, b).data(), fast));
            // A tag beats the scope.
            CHECK(same_bits(matmul<natural_scaling, float>(a, b, tc::exact_accumulation{}).data(), exact));
            // Other threads keep their own choice.
            tc::accumulation seen = tc::accumulation::h100_fast;
            std::thread([&] { seen = tc::current_accumulation(); }).join();
            CHECK(seen == tc::accumulation::exact);
        }
        CHECK(tc::current_accumulation() == tc::accumulation::h100);
        try {
            const tc::accumulation_scope<tc::exact_accumulation> throws;
            throw std::runtime_error("unwinding");
        } catch (const std::runtime_error&) {
        }
        CHECK(tc::current_accumulation() == tc::accumulation::h100);
    }
    CHECK(tc::current_accumulation() == tc::accumulation::exact);

    // Run-time: the command-line spellings, both ways.
    for (const char* text : {"exact", "h100", "h100-fast"}) CHECK(tc::to_string(tc::parse_accumulation(text)) == text);
    {
        const tc::accumulation_scope<> chosen("h100-fast");
        CHECK(same_bits(matmul<natural_scaling, float>(a, b).data(), fast));
    }
    {
        const tc::accumulation_scope chosen(tc::parse_accumulation(std::string("h100")));
        CHECK(same_bits(matmul<natural_scaling, float>(a, b).data(), promoted));
    }
    REQUIRE_THROWS_AS(tc::accumulation_scope<>("fast"), config_error);
    REQUIRE_THROWS_WITH(tc::parse_accumulation("H100"), Catch::Contains("'H100'") && Catch::Contains("h100-fast"));
    CHECK(tc::current_accumulation() == tc::accumulation::exact);
}

TEST_CASE("accumulation_scope reaches matmul_vjp; pairs a model does not cover stay exact", "[tensor_core][matmul][scope]")
{
    const auto g = scaled_random<float8_e5m2>(4, 6, 7, 1.0f);
    const auto a = scaled_random<float8_e4m3fn>(4, 300, 8, 1.0f);
    const auto b = scaled_random<float8_e4m3fn>(300, 6, 9, 1.0f);
    const tc::accumulation_scope<tc::h100_cublaslt_fp8_fast> scope;
    const auto [ga, gb] = matmul_vjp<natural_scaling, float>(g, a, b);
    CHECK(same_bits(ga.data(), tc::gemm<tc::h100_cublaslt_fp8_fast>(g.data(), transpose(b).data())));
    CHECK(same_bits(gb.data(), tc::gemm<tc::h100_cublaslt_fp8_fast>(transpose(a).data(), g.data())));

    // float x float: exact whatever the scope.
    const auto x = scaled_random<float>(3, 40, 10, 1.0f);
    const auto y = scaled_random<float>(40, 2, 11, 1.0f);
    const auto in_scope = matmul<natural_scaling, float>(x, y).data();
    const tc::accumulation_scope<tc::exact_accumulation> off;
    CHECK(same_bits(in_scope, matmul<natural_scaling, float>(x, y).data()));
}

TEST_CASE("matmul of f16 and bf16 under the H100 models runs an HMMA chain", "[tensor_core][matmul]")
{
    const auto a = scaled_random<Eigen::half>(5, 100, 12, 1.0f);
    const auto b = scaled_random<Eigen::half>(100, 3, 13, 1.0f);
    CHECK(same_bits(matmul<natural_scaling, float>(a, b, tc::h100_cublaslt_fp8_fast{}).data(),
                    tc::gemm<tc::h100_hmma_chain>(a.data(), b.data())));
    const auto c = scaled_random<Eigen::bfloat16>(5, 100, 14, 1.0f);
    const auto d = scaled_random<Eigen::bfloat16>(100, 3, 15, 1.0f);
    CHECK(same_bits(matmul<natural_scaling, float>(c, d, tc::h100_cublaslt_fp8{}).data(),
                    tc::gemm<tc::h100_hmma_chain>(c.data(), d.data())));
    // Mixed widths stay exact.
    const auto e = scaled_random<float8_e4m3fn>(5, 100, 16, 1.0f);
    CHECK(same_bits(matmul<natural_scaling, float>(e, b, tc::h100_cublaslt_fp8{}).data(),
                    matmul<natural_scaling, float>(e, b).data()));
}

// ---- one gemm_model template for every unit --------------------------------------------------------

static_assert(tc::MatrixInstruction<tc::h100_qgmma> && tc::MatrixInstruction<tc::a100_tf32> &&
              tc::MatrixInstruction<tc::amx_bf16> && tc::MatrixInstruction<tc::mi300_mfma> &&
              tc::MatrixInstruction<tc::b200_nvfp4> && !tc::MatrixInstruction<tc::h100_cublaslt_fp8>);
static_assert(tc::GemmModel<tc::h100_cublaslt_fp8> && tc::GemmModel<tc::amx_bf16_gemm> &&
              tc::GemmModel<tc::mi300_mfma_chain> && tc::GemmModel<tc::b200_nvfp4_chain>);
static_assert(std::same_as<tc::fma_gemm_model<tc::amx_bf16>, tc::gemm_model<tc::amx_bf16, 0>> &&
              std::same_as<tc::cdna_gemm_model<tc::mi300_mfma>, tc::gemm_model<tc::mi300_mfma, 0>> &&
              std::same_as<tc::block_gemm_model<tc::b200_nvfp4>, tc::gemm_model<tc::b200_nvfp4, 0>>);
static_assert(tc::CdnaGemmModel<tc::mi250_mfma_chain> && !tc::CdnaGemmModel<tc::amx_bf16_gemm> &&
              tc::BlockGemmModel<tc::b200_mxf4_chain> && !tc::BlockGemmModel<tc::b200_f8f6f4_chain>);
static_assert(tc::AccumulationModel<tc::mi300_mfma_chain> && !tc::AccumulationModel<tc::b200_nvfp4_chain>);

namespace {

/// A promoted chain on the AMX unit and on CDNA3: two instructions per partial sum.
struct unified_amx_promoted : tc::gemm_model<tc::amx_bf16, 2> {
    static constexpr const char* name = "unified_amx_promoted";
};
struct unified_mi300_promoted : tc::gemm_model<tc::mi300_mfma, 2> {
    static constexpr const char* name = "unified_mi300_promoted";
};

/// gemm<Promoted> against float32 adds of one-chain partials of `group` products each.
template <class Promoted, class Chain, class T>
void unified_check_promotion(std::size_t group)
{
    std::mt19937 rng(91);
    const std::size_t m = 3, k = 5 * group + group / 2, n = 18;  // a short last group
    const auto a = random_matrix<T>(m, k, rng);
    const auto b = random_matrix<T>(k, n, rng);
    const xt::xarray<float> d = tc::gemm<Promoted>(a, b);
    for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t j = 0; j < n; ++j) {
            const auto row = scalify::testing::row_of(a, i);
            const auto column = scalify::testing::column_of(b, j);
            float total = 0.0f;
            for (std::size_t s = 0; s < k; s += group) {
                const std::size_t len = std::min(group, k - s);
                total += tc::gemm_dot<Chain>(std::span<const T>(row.data() + s, len), std::span<const T>(column.data() + s, len));
            }
            REQUIRE(bits(d(i, j)) == bits(total));
            REQUIRE(bits(tc::gemm_dot<Promoted>(row, column)) == bits(total));
        }
    }
}

}  // namespace

TEST_CASE("gemm_model: any unit's instruction chains with a promotion interval", "[tensor_core][gemm]")
{
    unified_check_promotion<unified_amx_promoted, tc::amx_bf16_gemm, Eigen::bfloat16>(64);
    unified_check_promotion<unified_mi300_promoted, tc::mi300_mfma_chain, Eigen::half>(16);
}
