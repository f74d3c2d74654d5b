// matmul's run-time accumulation choice (tensor_core/accumulation.hpp): every GPU's value runs,
// for each operand pair, the bits of that GPU's GEMM model (tensor_core::gemm), exact float32
// where the GPU has no unit; tf32 only when asked for; scopes nest; the examples' --accumulate.
#include <scalify/scalify.hpp>

#include "../../examples/precision_modes.hpp"

#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

using namespace scalify;
namespace tc = scalify::tensor_core;

namespace {

template <class T>
ScaledArray<T> random_operand(std::vector<std::size_t> shape, unsigned seed, float scale)
{
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(0.0f, 48.0f);  // positive: the chains' cuts show
    auto x = xt::xarray<T>::from_shape(shape);
    for (auto& e : x) e = T(uniform(rng));
    return make_scaled_array(x, scale);
}

bool same_bits(const xt::xarray<float>& x, const xt::xarray<float>& y)
{
    if (x.shape() != y.shape()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
        if (std::bit_cast<std::uint32_t>(x.data()[i]) != std::bit_cast<std::uint32_t>(y.data()[i])) return false;
    return true;
}

template <class T>
xt::xarray<float> as_float(const xt::xarray<T>& x)
{
    xt::xarray<float> out = xt::xarray<float>::from_shape(x.shape());
    for (std::size_t i = 0; i < x.size(); ++i) out.data()[i] = static_cast<float>(x.data()[i]);
    return out;
}

/// Under `choice`, matmul of TA x TB data (M x K x N, two shapes) has the bits of gemm<Model>
/// (Model void: of the exact product), and differs from the exact product on the larger shape
/// where `differs` (b200's fp8 unit rounds each block's exact sum once: these sums are exact).
/// Float32-valued models (tf32, xf32) multiply the operands' float values where they do not take
/// the operands' own types.
template <class Model, class TA, class TB>
void expect_gemm(const char* choice, unsigned seed, bool differs = true)
{
    INFO("choice " << choice << ", " << element_name<TA> << " x " << element_name<TB>);
    for (const auto [m, k, n] : {std::array<std::size_t, 3>{3, 40, 5}, std::array<std::size_t, 3>{7, 300, 33}}) {
        const auto a = random_operand<TA>({m, k}, seed, 0.5f);
        const auto b = random_operand<TB>({k, n}, seed + 1, 0.25f);
        const auto exact = matmul<natural_scaling, float>(a, b).data();
        const tc::accumulation_scope<> scope(choice);
        const auto product = matmul<natural_scaling, float>(a, b);
        CHECK(product.scale() == 0.125f);
        if constexpr (std::is_void_v<Model>) {
            CHECK(same_bits(product.data(), exact));
        } else {
            if constexpr (!Model::instruction::template takes<TA, TB>) {
                CHECK(same_bits(product.data(), tc::gemm<Model>(as_float(a.data()), as_float(b.data()))));
            } else {
                CHECK(same_bits(product.data(), tc::gemm<Model>(a.data(), b.data())));
            }
            if (k == 300 && differs) CHECK(!same_bits(product.data(), exact));
        }
    }
}

using e4m3 = float8_e4m3fn;
using e5m2 = float8_e5m2;
using f16 = Eigen::half;
using bf16 = Eigen::bfloat16;

}  // namespace

TEST_CASE("each GPU's accumulation runs its GEMM model per operand pair, exact where it has no unit",
          "[tensor_core][matmul][accumulation]")
{
    SECTION("v100: f16 only")
    {
        expect_gemm<tc::v100_hmma_chain, f16, f16>("v100", 1);
        expect_gemm<void, bf16, bf16>("v100", 2);
        expect_gemm<void, e4m3, e4m3>("v100", 3);
        expect_gemm<void, float, float>("v100", 4);
    }
    SECTION("a100: f16, bf16, no fp8")
    {
        expect_gemm<tc::a100_hmma_chain, f16, f16>("a100", 5);
        expect_gemm<tc::a100_hmma_chain, bf16, bf16>("a100", 6);
        expect_gemm<void, e4m3, e5m2>("a100", 7);
        expect_gemm<void, float, float>("a100", 8);
        expect_gemm<tc::a100_tf32_chain, float, float>("a100+tf32", 9);
    }
    SECTION("ada")
    {
        expect_gemm<tc::ada_qmma_chain, e4m3, e4m3>("ada", 10);
        expect_gemm<tc::ada_qmma_chain, e5m2, e4m3>("ada", 11);
        expect_gemm<tc::ada_hmma_chain, bf16, bf16>("ada", 12);
        expect_gemm<tc::ada_tf32_chain, float, float>("ada+tf32", 13);
    }
    SECTION("h100, h100-fast")
    {
        expect_gemm<tc::h100_cublaslt_fp8, e4m3, e5m2>("h100", 14);
        expect_gemm<tc::h100_cublaslt_fp8_fast, e4m3, e4m3>("h100-fast", 15);
        expect_gemm<tc::h100_hmma_chain, f16, f16>("h100-fast", 16);
        expect_gemm<tc::h100_tf32_chain, float, float>("h100+tf32", 17);
    }
    SECTION("b200")
    {
        expect_gemm<tc::b200_qmma_chain, e5m2, e5m2>("b200", 18, false);
        expect_gemm<tc::b200_hmma_chain, f16, f16>("b200", 19);
        expect_gemm<tc::b200_tf32_chain, float, float>("b200+tf32", 20);
        expect_gemm<void, float, float>("b200", 21);
    }
    SECTION("amx: bf16 (AMX-BF16) and f16 (AMX-FP16), no fp8")
    {
        expect_gemm<tc::amx_bf16_gemm, bf16, bf16>("amx", 22);
        expect_gemm<tc::amx_fp16_gemm, f16, f16>("amx", 23);
        expect_gemm<void, e4m3, e4m3>("amx", 24);
        expect_gemm<void, float, float>("amx", 29);
        const tc::accumulation_scope<> amx("amx");
        CHECK(tc::current_gemm_name(dtype::float16, dtype::float16) == "amx_fp16_gemm");
        CHECK(tc::current_gemm_name(dtype::bfloat16, dtype::bfloat16) == "amx_bf16_gemm");
        CHECK(tc::current_gemm_name(dtype::float16, dtype::bfloat16) == "exact");
    }
    SECTION("b200-f8f6f4: fp8 on tcgen05 kind::f8f6f4, the rest as b200")
    {
        expect_gemm<tc::b200_f8f6f4_chain, e4m3, e5m2>("b200-f8f6f4", 60);
        expect_gemm<tc::b200_hmma_chain, bf16, bf16>("b200-f8f6f4", 61);
        expect_gemm<tc::b200_tf32_chain, float, float>("b200-f8f6f4+tf32", 62);
        expect_gemm<void, float, float>("b200-f8f6f4", 63);
    }
    SECTION("mi100, mi250: f16 and bf16 only")
    {
        expect_gemm<tc::mi100_mfma_chain, f16, f16>("mi100", 64);
        expect_gemm<tc::mi100_mfma_chain, bf16, bf16>("mi100", 65);
        expect_gemm<void, e4m3, e4m3>("mi100", 66);
        expect_gemm<tc::mi250_mfma_chain, f16, f16>("mi250", 67);
        expect_gemm<tc::mi250_mfma_chain, bf16, bf16>("mi250", 68);
        expect_gemm<void, float, float>("mi250", 69);
    }
    SECTION("mi300: f16, bf16; xf32 when asked for; OCP fp8 stays exact (its fp8 units take fnuz)")
    {
        expect_gemm<tc::mi300_mfma_chain, f16, f16>("mi300", 70);
        expect_gemm<tc::mi300_mfma_chain, bf16, bf16>("mi300", 71);
        expect_gemm<void, float, float>("mi300", 72);
        expect_gemm<void, e4m3, e5m2>("mi300", 73);
        expect_gemm<tc::mi300_mfma_chain, float, float>("mi300+tf32", 74);
        expect_gemm<tc::mi300_mfma_chain, e4m3, f16>("mi300+tf32", 75);
    }
    SECTION("mixed pairs: exact, or tf32 of their float values when asked for")
    {
        expect_gemm<void, e4m3, f16>("h100", 25);
        expect_gemm<void, bf16, float>("b200", 26);
        expect_gemm<tc::h100_tf32_chain, e4m3, f16>("h100+tf32", 27);
        expect_gemm<tc::a100_tf32_chain, bf16, float>("a100+tf32", 28);
    }
}

TEST_CASE("GPUs that share a unit's arithmetic share its engine; the others differ",
          "[tensor_core][matmul][accumulation]")
{
    STATIC_REQUIRE(tc::detail::same_arithmetic<tc::ada_hmma_chain, tc::a100_hmma_chain>);
    STATIC_REQUIRE(tc::detail::same_arithmetic<tc::b200_hmma_chain, tc::h100_hmma_chain>);
    STATIC_REQUIRE(!tc::detail::same_arithmetic<tc::a100_hmma_chain, tc::h100_hmma_chain>);
    STATIC_REQUIRE(!tc::detail::same_arithmetic<tc::ada_qmma_chain, tc::h100_cublaslt_fp8_fast>);
    const auto a = random_operand<e4m3>({4, 512}, 30, 1.0f);
    const auto b = random_operand<e4m3>({512, 6}, 31, 1.0f);
    const auto under = [&](const char* choice) {
        const tc::accumulation_scope<> scope(choice);
        return matmul<natural_scaling, float>(a, b).data();
    };
    CHECK(!same_bits(under("ada"), under("h100-fast")));  // 16 vs 32 products per block
    CHECK(!same_bits(under("b200"), under("h100")));
    const auto x = random_operand<f16>({4, 512}, 32, 1.0f);
    const auto y = random_operand<f16>({512, 6}, 33, 1.0f);
    const auto half_under = [&](const char* choice) {
        const tc::accumulation_scope<> scope(choice);
        return matmul<natural_scaling, float>(x, y).data();
    };
    CHECK(same_bits(half_under("a100"), half_under("ada")));
    CHECK(same_bits(half_under("h100"), half_under("b200")));
    CHECK(!same_bits(half_under("a100"), half_under("h100")));  // F = 24 vs 25, K = 8 vs 16
}

TEST_CASE("the run-time choice reaches batched products, matmul_vjp and operands on grids",
          "[tensor_core][matmul][accumulation]")
{
    const tc::accumulation_scope<> scope("ada");
    // Batched: each batch is the model's GEMM of its slices.
    const auto a = random_operand<e4m3>({2, 3, 64}, 40, 1.0f);
    const auto b = random_operand<e5m2>({2, 64, 5}, 41, 1.0f);
    const auto batched = matmul<natural_scaling, float>(a, b).data();
    for (std::size_t t = 0; t < 2; ++t) {
        const xt::xarray<e4m3> at = xt::view(a.data(), t);
        const xt::xarray<e5m2> bt = xt::view(b.data(), t);
        const xt::xarray<float> slice = xt::view(batched, t);
        CHECK(same_bits(slice, tc::gemm<tc::ada_qmma_chain>(at, bt)));
    }
    // matmul_vjp: the products of operands stored transposed.
    const auto g = random_operand<e5m2>({4, 6}, 42, 1.0f);
    const auto x = random_operand<e4m3>({4, 96}, 43, 1.0f);
    const auto w = random_operand<e4m3>({96, 6}, 44, 1.0f);
    const auto [gx, gw] = matmul_vjp<natural_scaling, float>(g, x, w);
    CHECK(same_bits(gx.data(), tc::gemm<tc::ada_qmma_chain>(g.data(), transpose(w).data())));
    CHECK(same_bits(gw.data(), tc::gemm<tc::ada_qmma_chain>(transpose(x).data(), g.data())));
    // float32 values on formats' grids (a precision scope's operands) read as those formats.
    const auto xf = cast<float>(x);
    const auto wf = cast<float>(w);
    const auto on_grids = scalify::detail::matmul_on_grids<natural_scaling, float>(
        xf, wf, scalify::detail::operand_grids{dtype::float8_e4m3fn, dtype::float8_e4m3fn});
    CHECK(same_bits(on_grids.data(), tc::gemm<tc::ada_qmma_chain>(x.data(), w.data())));
    const auto plain = scalify::detail::matmul_on_grids<natural_scaling, float>(xf, wf, scalify::detail::operand_grids{});
    CHECK(same_bits(plain.data(), matmul<natural_scaling, float>(xf, wf, tc::exact_accumulation{}).data()));
}

TEST_CASE("accumulation scopes of every GPU nest and restore", "[tensor_core][accumulation][scope]")
{
    CHECK(tc::current_accumulation() == tc::accumulation::exact);
    {
        const tc::accumulation_scope<> outer(tc::accumulation::a100);
        CHECK(tc::current_accumulation() == tc::accumulation::a100);
        CHECK(tc::current_gemm_name(dtype::float16, dtype::float16) == "a100_hmma_chain");
        CHECK(tc::current_gemm_name(dtype::float8_e4m3fn, dtype::float8_e4m3fn) == "exact");
        {
            const tc::accumulation_scope<> inner("b200+tf32");
            CHECK(tc::current_accumulation_choice() == tc::accumulation_choice{tc::accumulation::b200, true});
            CHECK(tc::current_gemm_name(dtype::float32, dtype::float32) == "b200_tf32_chain");
            CHECK(tc::current_gemm_name(dtype::float8_e5m2, dtype::float8_e4m3fn) == "b200_qmma_chain");
            {
                const tc::accumulation_scope<tc::h100_cublaslt_fp8_fast> tagged;
                CHECK(tc::current_accumulation() == tc::accumulation::h100_fast);
                CHECK(!tc::current_accumulation_choice().tf32);
            }
            try {
                const tc::accumulation_scope<> throws(tc::accumulation_choice{tc::accumulation::amx});
                throw std::runtime_error("unwinding");
            } catch (const std::runtime_error&) {
            }
            CHECK(to_string(tc::current_accumulation_choice()) == "b200+tf32");
            {
                const tc::accumulation_scope<> amd("mi250");
                CHECK(tc::current_gemm_name(dtype::bfloat16, dtype::bfloat16) == "mi250_mfma_chain");
                CHECK(tc::current_gemm_name(dtype::float32, dtype::float32) == "exact");
            }
        }
        CHECK(tc::current_accumulation_choice() == tc::accumulation_choice{tc::accumulation::a100});
    }
    CHECK(tc::current_accumulation() == tc::accumulation::exact);
    CHECK(tc::current_gemm_name(dtype::float16, dtype::float16) == "exact");
}

TEST_CASE("accumulation spellings: every GPU, +tf32 where it has the unit, a message naming the choices",
          "[tensor_core][accumulation]")
{
    for (const tc::accumulation mode : tc::all_accumulations) {
        CHECK(tc::parse_accumulation(tc::to_string(mode)) == tc::accumulation_choice{mode});
        if (tc::accumulation_has_tf32(mode)) {
            const std::string text = std::string(tc::to_string(mode)) + "+tf32";
            CHECK(to_string(tc::parse_accumulation(text)) == text);
        }
    }
    CHECK(!tc::accumulation_has_tf32(tc::accumulation::v100));
    CHECK(!tc::accumulation_has_tf32(tc::accumulation::amx));
    CHECK(!tc::accumulation_has_tf32(tc::accumulation::mi250));
    CHECK(tc::accumulation_has_tf32(tc::accumulation::mi300));
    CHECK(tc::parse_accumulation("mi300+tf32") == tc::accumulation_choice{tc::accumulation::mi300, true});
    CHECK(tc::to_string(tc::accumulation::b200_f8f6f4) == "b200-f8f6f4");
    CHECK_THROWS_WITH(tc::parse_accumulation("mi400"), Catch::Contains("b200-f8f6f4, mi100, mi250, mi300"));
    for (const char* bad : {"H100", "a100-tf32", "tf32", "+tf32", "a100+", "b100", ""}) {
        INFO(bad);
        CHECK_THROWS_AS(tc::parse_accumulation(bad), config_error);
        CHECK_THROWS_WITH(tc::parse_accumulation(bad), Catch::Contains("exact, v100, a100, ada, h100, h100-fast, b200, amx"));
    }
    CHECK_THROWS_WITH(tc::parse_accumulation("v100+tf32"), Catch::Contains("v100 has no tf32 unit"));
    CHECK_THROWS_AS(tc::accumulation_scope<>(tc::accumulation_choice{tc::accumulation::amx, true}), config_error);
    CHECK(tc::current_accumulation() == tc::accumulation::exact);
}

TEST_CASE("the examples' --accumulate takes every spelling and names the choices otherwise", "[examples][accumulation]")
{
    CHECK(examples::parse_accumulate("b200+tf32") == tc::accumulation_choice{tc::accumulation::b200, true});
    CHECK(examples::parse_accumulate("amx") == tc::accumulation_choice{tc::accumulation::amx});
    CHECK(examples::parse_accumulate("mi300") == tc::accumulation_choice{tc::accumulation::mi300});
    CHECK(examples::parse_accumulate("b200-f8f6f4") == tc::accumulation_choice{tc::accumulation::b200_f8f6f4});
    CHECK_THROWS_AS(examples::parse_accumulate("h200"), std::runtime_error);
    CHECK_THROWS_WITH(examples::parse_accumulate("h200"),
                      Catch::Contains("--accumulate") && Catch::Contains("'h200'") && Catch::Contains("h100-fast") &&
                          Catch::Contains("b200"));
}

TEST_CASE("matmul takes the AMX GEMM models per call", "[tensor_core][matmul][accumulation]")
{
    const auto a = random_operand<bf16>({5, 70}, 50, 1.0f);
    const auto b = random_operand<bf16>({70, 4}, 51, 1.0f);
    CHECK(same_bits(matmul<natural_scaling, float>(a, b, tc::amx_bf16_gemm{}).data(), tc::gemm<tc::amx_bf16_gemm>(a.data(), b.data())));
    CHECK(same_bits(matmul<natural_scaling, float>(a, b, tc::avx512_bf16_gemm{}).data(),
                    tc::gemm<tc::avx512_bf16_gemm>(a.data(), b.data())));
    // A pair the model does not take stays exact.
    const auto x = random_operand<f16>({5, 70}, 52, 1.0f);
    const auto y = random_operand<f16>({70, 4}, 53, 1.0f);
    CHECK(same_bits(matmul<natural_scaling, float>(x, y, tc::amx_bf16_gemm{}).data(), matmul<natural_scaling, float>(x, y).data()));
}

TEST_CASE("matmul takes the CDNA GEMM models per call", "[tensor_core][matmul][accumulation]")
{
    const auto a = random_operand<f16>({5, 70}, 54, 1.0f);
    const auto b = random_operand<f16>({70, 4}, 55, 1.0f);
    CHECK(same_bits(matmul<natural_scaling, float>(a, b, tc::mi300_mfma_chain{}).data(),
                    tc::gemm<tc::mi300_mfma_chain>(a.data(), b.data())));
    const auto x = random_operand<bf16>({5, 70}, 56, 1.0f);
    const auto y = random_operand<bf16>({70, 4}, 57, 1.0f);
    CHECK(same_bits(matmul<natural_scaling, float>(x, y, tc::mi250_mfma_chain{}).data(),
                    tc::gemm<tc::mi250_mfma_chain>(x.data(), y.data())));
    // OCP fp8: no CDNA3 unit takes it; exact.
    const auto p = random_operand<e4m3>({5, 70}, 58, 1.0f);
    const auto q = random_operand<e4m3>({70, 4}, 59, 1.0f);
    CHECK(same_bits(matmul<natural_scaling, float>(p, q, tc::mi300_mfma_chain{}).data(), matmul<natural_scaling, float>(p, q).data()));
}
