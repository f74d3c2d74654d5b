// tensor_core_public: the NVIDIA unit models (v100_hmma, a100_hmma, ada_hmma, ada_qmma, h100_hmma,
// h100_qgmma, b200_hmma, b200_qmma; the tf32 units a100_tf32 to b200_tf32; the float16-accumulator
// units *_f16acc) against every vendored vector of the public GPU captures of Khattak and Mikaitis
// (tests/data/tensor_core_public/, README there), bit for bit per (model, GPU, format,
// accumulator); the rules the captures do not reach (rounding ties, non-finite input) on
// hand-made cases; each unit's GEMM chain against loops of its instruction.
#include <scalify/scalify.hpp>

#include "../support/gemm_reference.hpp"
#include "../support/tensor_core_public.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tc_public {

using namespace scalify;
namespace tc = scalify::tensor_core;
using tensor_core_public::from_code;
using tensor_core_public::match;
using tensor_core_public::match_result;
using tensor_core_public::vector_set;

inline vector_set read_set(const std::string& gpu, const std::string& format)
{
    const vector_set s = tensor_core_public::read_set_file(std::string(SCALIFY_TEST_DATA_DIR) + "/tensor_core_public/" +
                                                           gpu + "/" + format + "/" + gpu + "_" + format + "_fp32.bin");
    REQUIRE(s.gpu == gpu);
    REQUIRE(s.format == format);
    return s;
}

/// Every line of the set through Model (C = 0 for the H100 and H200 fp8 sets, as captured), bit
/// for bit; on failure the count of mismatches and the first one.
template <tc::InnerProductModel Model, class T>
void check_all(const std::string& gpu, const std::string& format)
{
    const vector_set s = read_set(gpu, format);
    CHECK(s.lines == 1250);
    const match_result r = match<Model, T>(s, s.zero_c());
    INFO(Model::name << " on " << gpu << " " << format << ": " << r.lines - r.equal << " of " << r.lines
                     << " vectors differ; first: " << r.first_miss);
    CHECK(r.equal == r.lines);
    // The unit match_unit picks for the set (what tensor_core_match runs) is this model.
    CHECK(tensor_core_public::match_unit(s).model == std::string(Model::name));
}

inline std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

}  // namespace tc_public

TEST_CASE("the NVIDIA unit models reproduce every vendored public vector", "[tensor_core][public]")
{
    using namespace tc_public;
    using scalify::float8_e4m3fn;
    using scalify::float8_e5m2;
    using half = Eigen::half;
    using bf16 = Eigen::bfloat16;

    SECTION("V100") { check_all<tc::v100_hmma, half>("V100", "fp16"); }
    SECTION("A100 and A2")
    {
        check_all<tc::a100_hmma, half>("A100", "fp16");
        check_all<tc::a100_hmma, bf16>("A100", "bf16");
        check_all<tc::a2_hmma, half>("A2", "fp16");
        check_all<tc::a2_hmma, bf16>("A2", "bf16");
    }
    SECTION("Ada and L40S")
    {
        for (const char* gpu : {"Ada", "L40S"}) {
            check_all<tc::ada_hmma, half>(gpu, "fp16");
            check_all<tc::ada_hmma, bf16>(gpu, "bf16");
            check_all<tc::ada_qmma, float8_e4m3fn>(gpu, "E4M3");
            check_all<tc::ada_qmma, float8_e5m2>(gpu, "E5M2");
        }
    }
    SECTION("H100 and H200")
    {
        check_all<tc::h100_hmma, half>("H100", "fp16");
        check_all<tc::h100_hmma, bf16>("H100", "bf16");
        check_all<tc::h100_qgmma, float8_e4m3fn>("H100", "E4M3");
        check_all<tc::h100_qgmma, float8_e5m2>("H100", "E5M2");
        check_all<tc::h200_hmma, half>("H200", "fp16");
        check_all<tc::h200_hmma, bf16>("H200", "bf16");
        check_all<tc::h200_qgmma, float8_e4m3fn>("H200", "E4M3");
        check_all<tc::h200_qgmma, float8_e5m2>("H200", "E5M2");
    }
    SECTION("B200")
    {
        check_all<tc::b200_hmma, half>("B200", "fp16");
        check_all<tc::b200_hmma, bf16>("B200", "bf16");
        check_all<tc::b200_qmma, float8_e4m3fn>("B200", "E4M3");
        check_all<tc::b200_qmma, float8_e5m2>("B200", "E5M2");
    }
}

namespace tc_public {
/// MMA-Sim's tcgen05 kind::f8f6f4 rule (F = 25, P = 24, K = 32, every cut toward zero).
struct mmasim_tcgen05_f8 : tc::inner_product_model<25, 24, 32, tc::any_pair_of<float8_e4m3fn, float8_e5m2>> {
    static constexpr const char* name = "mmasim_tcgen05_f8";
};
/// The same with the sum rounded to nearest even (the MATLAB model B200TCRN's fp8 setting).
struct b200_f25_nearest
    : tc::inner_product_model<25, 24, 32, tc::any_pair_of<float8_e4m3fn, float8_e5m2>, tc::nearest_result_rules> {
    static constexpr const char* name = "b200_f25_nearest";
};
/// b200_qmma with F = 29 and 30: the capture's lower bound on F.
template <int F>
struct b200_nearest_f : tc::inner_product_model<F, 24, 32, tc::any_pair_of<float8_e4m3fn, float8_e5m2>, tc::nearest_result_rules> {
    static constexpr const char* name = "b200_nearest_f";
};
/// Ada's fp8 rule on one block of 32 (no split): the split matters.
struct ada_qmma_unsplit : tc::inner_product_model<13, 14, 32, tc::any_pair_of<float8_e4m3fn, float8_e5m2>> {
    static constexpr const char* name = "ada_qmma_unsplit";
};
}  // namespace tc_public

TEST_CASE("the B200 fp8 capture: the published rules it rejects, the bound on F", "[tensor_core][public]")
{
    using namespace tc_public;
    const vector_set e4m3 = read_set("B200", "E4M3");
    const vector_set e5m2 = read_set("B200", "E5M2");
    // The counts docs/tensor_core.md quotes.
    CHECK(match<mmasim_tcgen05_f8, float8_e4m3fn>(e4m3, false).equal == 804);
    CHECK(match<mmasim_tcgen05_f8, float8_e5m2>(e5m2, false).equal == 813);
    CHECK(match<b200_f25_nearest, float8_e4m3fn>(e4m3, false).equal == 1175);
    CHECK(match<b200_f25_nearest, float8_e5m2>(e5m2, false).equal == 1168);
    CHECK(match<b200_nearest_f<29>, float8_e4m3fn>(e4m3, false).equal == 1250);
    CHECK(match<b200_nearest_f<29>, float8_e5m2>(e5m2, false).equal == 1249);
    CHECK(match<b200_nearest_f<30>, float8_e5m2>(e5m2, false).equal == 1250);
    // Ada's fp8 unit takes 16 products per block: one block of 32 misses.
    CHECK(match<ada_qmma_unsplit, float8_e4m3fn>(read_set("L40S", "E4M3"), false).equal == 981);
    CHECK(match<ada_qmma_unsplit, float8_e5m2>(read_set("L40S", "E5M2"), false).equal == 1089);
}

TEST_CASE("b200_qmma rounds to nearest even; the cut-toward-zero units do not", "[tensor_core][public]")
{
    using namespace tc_public;
    // 2^-18 is half an ulp of 64 (ulp 2^-17): the smallest e4m3 subnormal squared.
    std::array<float8_e4m3fn, 32> a{}, b{};
    a[0] = b[0] = float8_e4m3fn(0x1p-9f);
    REQUIRE(static_cast<float>(a[0]) == 0x1p-9f);
    CHECK(tc::dot<tc::b200_qmma>(a, b, 64.0f) == 64.0f);                                 // tie, even kept
    CHECK(tc::dot<tc::b200_qmma>(a, b, 64.0f + 0x1p-17f) == 64.0f + 0x1p-16f);           // tie, up to even
    a[0] = float8_e4m3fn(-0x1p-9f);
    CHECK(tc::dot<tc::b200_qmma>(a, b, -64.0f - 0x1p-17f) == -64.0f - 0x1p-16f);         // symmetric
    a[0] = float8_e4m3fn(0x1p-9f);
    a[1] = b[1] = float8_e4m3fn(0x1p-9f);
    a[2] = b[2] = float8_e4m3fn(0x1p-9f);                                                 // 1.5 ulp
    CHECK(tc::dot<tc::b200_qmma>(a, b, 64.0f) == 64.0f + 0x1p-16f);
    // The cut-toward-zero units keep 64 + 1 ulp at most (ada_qmma: 14 bits, so 64 itself).
    std::array<float8_e4m3fn, 16> a16{}, b16{};
    std::copy_n(a.begin(), 16, a16.begin());
    std::copy_n(b.begin(), 16, b16.begin());
    CHECK(tc::dot<tc::ada_qmma>(a16, b16, 64.0f) == 64.0f);
    std::array<Eigen::half, 16> h{}, g{};
    h[0] = g[0] = Eigen::half(0x1p-9f);
    h[1] = g[1] = Eigen::half(0x1p-9f);
    h[2] = g[2] = Eigen::half(0x1p-9f);
    CHECK(tc::dot<tc::b200_hmma>(h, g, 64.0f) == 64.0f + 0x1p-17f);
}

TEST_CASE("the NVIDIA unit models: non-finite and subnormal input", "[tensor_core][public]")
{
    using namespace tc_public;
    constexpr float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::array<Eigen::half, 4> a{}, b{};
    a[0] = Eigen::half(inf);
    b[0] = Eigen::half(2.0f);
    CHECK(tc::dot<tc::v100_hmma>(a, b, 1.0f) == inf);
    b[0] = Eigen::half(0.0f);
    CHECK(bits_of(tc::dot<tc::v100_hmma>(a, b, 1.0f)) == 0x7fffffffu);  // inf * 0: canonical NaN
    CHECK(bits_of(tc::dot<tc::v100_hmma>(std::array<Eigen::half, 4>{}, std::array<Eigen::half, 4>{}, nan)) ==
          0x7fffffffu);
    std::array<Eigen::bfloat16, 8> x{}, y{};
    x[0] = Eigen::bfloat16(-inf);
    y[0] = Eigen::bfloat16(1.0f);
    CHECK(tc::dot<tc::a100_hmma>(x, y, inf) != tc::dot<tc::a100_hmma>(x, y, inf));  // -inf + inf: NaN
    CHECK(tc::dot<tc::ada_hmma>(x, y, 0.0f) == -inf);
    std::array<float8_e4m3fn, 32> p{}, q{};
    p[0] = float8_e4m3fn::from_bits(0x7f);  // e4m3fn NaN
    q[0] = float8_e4m3fn(1.0f);
    CHECK(bits_of(tc::dot<tc::b200_qmma>(p, q, 0.0f)) == 0x7fffffffu);
    // Subnormal operands take part with their exact value: 2^-16 * 2^-16 on e5m2.
    std::array<float8_e5m2, 16> s{}, t{};
    s[0] = t[0] = float8_e5m2(0x1p-16f);
    REQUIRE(static_cast<float>(s[0]) == 0x1p-16f);
    CHECK(tc::dot<tc::ada_qmma>(s, t, 0.0f) == 0x1p-32f);
    std::array<float8_e5m2, 32> s32{}, t32{};
    s32[0] = t32[0] = float8_e5m2(0x1p-16f);
    CHECK(tc::dot<tc::b200_qmma>(s32, t32, 0.0f) == 0x1p-32f);
    // The exceptional cases Khattak and Mikaitis's model tests state: C + a*b past float32's
    // range gives +inf (2^127 + 2^127), +inf * -inf gives -inf, +inf and -inf terms give NaN.
    std::array<Eigen::bfloat16, 16> u{}, w{};
    u[0] = Eigen::bfloat16(0x1p127f);
    w[0] = Eigen::bfloat16(1.0f);
    CHECK(tc::dot<tc::b200_hmma>(u, w, 0x1p127f) == inf);
    CHECK(tc::dot<tc::b200_hmma>(u, w, -0x1p127f) == 0.0f);
    std::array<Eigen::bfloat16, 8> u8{}, w8{};
    std::copy_n(u.begin(), 8, u8.begin());
    std::copy_n(w.begin(), 8, w8.begin());
    CHECK(tc::dot<tc::a100_hmma>(u8, w8, 0x1p127f) == inf);
    u[0] = Eigen::bfloat16(inf);
    w[0] = Eigen::bfloat16(-inf);
    CHECK(tc::dot<tc::b200_hmma>(u, w, 0.0f) == -inf);
    u[1] = Eigen::bfloat16(inf);
    w[1] = Eigen::bfloat16(1.0f);
    CHECK(bits_of(tc::dot<tc::b200_hmma>(u, w, 0.0f)) == 0x7fffffffu);
    // An empty sum is +0, also for C = -0.
    CHECK(bits_of(tc::dot<tc::b200_qmma>(std::array<float8_e5m2, 32>{}, std::array<float8_e5m2, 32>{}, -0.0f)) == 0u);
}

namespace tc_public {
/// Random finite codes of T (a sixteenth of them zero).
template <class T>
xt::xarray<T> random_codes(std::size_t rows, std::size_t cols, std::mt19937& rng)
{
    using format = typename float_traits<T>::format;
    std::uniform_int_distribution<unsigned> code(0, (1u << format::total_bits) - 1);
    std::uniform_int_distribution<int> pick(0, 15);
    auto x = xt::xarray<T>::from_shape({rows, cols});
    for (auto& e : x) {
        do {
            e = pick(rng) == 0 ? from_code<T>(0) : from_code<T>(code(rng));
        } while (!std::isfinite(static_cast<float>(e)));
    }
    return x;
}

/// gemm<Model> (lanes where they fit), gemm_dot<Model> (the reference chain) and the GEMM over
/// float32 values on the formats' grids agree bit for bit.
template <tc::GemmModel Model, class T>
void check_chain(std::size_t m, std::size_t k, std::size_t n, unsigned seed)
{
    std::mt19937 rng(seed);
    const auto a = random_codes<T>(m, k, rng);
    const auto b = random_codes<T>(k, n, rng);
    const xt::xarray<float> d = tc::gemm<Model>(a, b);
    const std::size_t mismatches = m * n - scalify::testing::outputs_agreeing_with_gemm_dot<Model>(d, a, b);
    const xt::xarray<float> a_values = xt::cast<float>(a), b_values = xt::cast<float>(b);
    std::vector<float> on_grid(m * n, -1.0f);
    tc::detail::gemm_into_on_grid<Model, T, T>(a_values.data(), b_values.data(), m, k, n, on_grid.data());
    std::size_t grid_mismatches = 0;
    for (std::size_t i = 0; i < m * n; ++i) grid_mismatches += bits_of(on_grid[i]) == bits_of(d.data()[i]) ? 0 : 1;
    INFO(Model::name << " " << m << "x" << k << "x" << n << " seed " << seed);
    CHECK(mismatches == 0);
    CHECK(grid_mismatches == 0);
}
}  // namespace tc_public

TEST_CASE("the units' GEMM chains equal loops of their instruction", "[tensor_core][public][gemm]")
{
    using namespace tc_public;
    // Shapes off the lanes' 32 outputs and off each instruction's K.
    check_chain<tc::v100_hmma_chain, Eigen::half>(5, 37, 33, 1);
    check_chain<tc::a100_hmma_chain, Eigen::half>(5, 70, 33, 2);
    check_chain<tc::a100_hmma_chain, Eigen::bfloat16>(4, 45, 9, 3);
    check_chain<tc::ada_hmma_chain, Eigen::half>(3, 50, 40, 4);
    check_chain<tc::ada_hmma_chain, Eigen::bfloat16>(3, 50, 40, 5);
    check_chain<tc::ada_qmma_chain, float8_e4m3fn>(6, 100, 35, 6);
    check_chain<tc::ada_qmma_chain, float8_e5m2>(6, 100, 35, 7);
    check_chain<tc::b200_hmma_chain, Eigen::half>(5, 70, 33, 8);
    check_chain<tc::b200_hmma_chain, Eigen::bfloat16>(5, 70, 33, 9);
    check_chain<tc::b200_qmma_chain, float8_e4m3fn>(6, 100, 35, 10);
    check_chain<tc::b200_qmma_chain, float8_e5m2>(6, 100, 35, 11);
    // A chain is its instruction applied block after block from 0.
    std::mt19937 rng(12);
    const auto a = random_codes<float8_e4m3fn>(1, 64, rng);
    const auto b = random_codes<float8_e4m3fn>(1, 64, rng);
    std::vector<float8_e4m3fn> x(a.begin(), a.end()), y(b.begin(), b.end());
    float acc = 0.0f;
    for (std::size_t first = 0; first < 64; first += 16) {
        acc = tc::dot<tc::ada_qmma>(std::span<const float8_e4m3fn>(x).subspan(first, 16),
                                    std::span<const float8_e4m3fn>(y).subspan(first, 16), acc);
    }
    CHECK(bits_of(tc::gemm_dot<tc::ada_qmma_chain>(x, y)) == bits_of(acc));
}

// ---- tf32 operands and float16 accumulators --------------------------------------------------

namespace tc_public {
/// A packed set with a float32 (result "fp32") or float16 ("fp16") result; tf32 operands are
/// stored as 4-byte float32 words.
inline vector_set read_result_set(const std::string& gpu, const std::string& format, const std::string& result)
{
    const vector_set s = tensor_core_public::read_set_file(std::string(SCALIFY_TEST_DATA_DIR) + "/tensor_core_public/" +
                                                           gpu + "/" + format + "/" + gpu + "_" + format + "_" + result +
                                                           ".bin");
    REQUIRE(s.gpu == gpu);
    REQUIRE(s.format == format);
    REQUIRE(s.lines == 1250);
    REQUIRE(s.elem_bytes == (format == "tf32" ? 4u : format == "fp16" || format == "bf16" ? 2u : 1u));
    return s;
}

/// Operand kk of line i (operand 0: a, 1: b) as T: a float32 word for float (tf32 sets), else a code.
template <class T>
T operand_of(const vector_set& s, std::size_t i, std::size_t operand, std::size_t kk)
{
    if constexpr (std::same_as<T, float>) {
        std::uint32_t word;
        std::memcpy(&word, s.record(i) + (operand * s.k + kk) * 4, 4);
        return std::bit_cast<float>(word);
    } else {
        return from_code<T>(s.code(i, operand, kk));
    }
}

/// Every line through Model's instruction, block after block (a short last block padded with
/// zeros, which take no part), from the line's C as the accumulator type reads it (float16: C
/// rounded to nearest even, as the capture's __float2half); the count of lines whose result
/// equals D bit for bit (a float16 result compared as the float32 of its value).
template <tc::InnerProductModel Model, class T>
match_result match_lines(const vector_set& s)
{
    using acc_t = typename Model::accumulator;
    match_result r;
    r.model = Model::name;
    r.lines = s.lines;
    const std::size_t padded = (s.k + Model::k - 1) / Model::k * Model::k;
    std::vector<T> a(padded, T(0.0f)), b(padded, T(0.0f));
    for (std::size_t i = 0; i < s.lines; ++i) {
        for (std::size_t kk = 0; kk < s.k; ++kk) {
            a[kk] = operand_of<T>(s, i, 0, kk);
            b[kk] = operand_of<T>(s, i, 1, kk);
        }
        acc_t acc = acc_t(std::bit_cast<float>(s.word(i, 0)));
        for (std::size_t first = 0; first < padded; first += Model::k) {
            acc = tc::dot<Model>(std::span<const T>(a).subspan(first, Model::k),
                                 std::span<const T>(b).subspan(first, Model::k), acc);
        }
        const std::uint32_t got = bits_of(static_cast<float>(acc));
        if (got == s.word(i, 1)) {
            ++r.equal;
        } else if (r.first_miss.empty()) {
            std::ostringstream text;
            text << "line " << i << ": model " << std::hex << got << ", GPU " << s.word(i, 1);
            r.first_miss = text.str();
        }
    }
    return r;
}

template <tc::InnerProductModel Model, class T>
void check_lines(const std::string& gpu, const std::string& format, const std::string& result)
{
    const match_result r = match_lines<Model, T>(read_result_set(gpu, format, result));
    INFO(Model::name << " on " << gpu << " " << format << " (" << result << " result): " << r.lines - r.equal << " of "
                     << r.lines << " vectors differ; first: " << r.first_miss);
    CHECK(r.equal == r.lines);
}

/// The tf32 units' rule with other F, P, K, rules or input reading: how tightly the capture pins them.
template <int F, int P, std::size_t K, class Rules = tc::h100_rules, tc::tf32_input Input = tc::tf32_input::truncate>
struct tf32_variant : tc::inner_product_model<F, P, K, tc::tf32_operands<Input>, Rules> {
    static constexpr const char* name = "tf32_variant";
};
/// A float16-accumulator rule with other F, K or rules.
template <int F, std::size_t K, class Operands, class Rules = tc::nearest_result_rules>
struct f16acc_variant : tc::inner_product_model<F, 11, K, Operands, Rules, Eigen::half> {
    static constexpr const char* name = "f16acc_variant";
};
using fp8_pairs = tc::any_pair_of<float8_e4m3fn, float8_e5m2>;

/// The best rule found for the H100, H200 and B200 fp8 sets with a float16 accumulator (none
/// reproduces them): the 32 products summed exactly and rounded to float16 on their own, then
/// C (float16) added with one float16 rounding.
template <class T>
std::size_t products_then_c(const vector_set& s)
{
    using sum_unit = f16acc_variant<40, 32, fp8_pairs>;
    std::size_t equal = 0;
    std::vector<T> a(32), b(32);
    for (std::size_t i = 0; i < s.lines; ++i) {
        for (std::size_t kk = 0; kk < 32; ++kk) {
            a[kk] = operand_of<T>(s, i, 0, kk);
            b[kk] = operand_of<T>(s, i, 1, kk);
        }
        const Eigen::half products = tc::dot<sum_unit>(a, b, Eigen::half(0.0f));
        const Eigen::half c(std::bit_cast<float>(s.word(i, 0)));
        const Eigen::half d(static_cast<double>(static_cast<float>(products)) + static_cast<double>(static_cast<float>(c)));
        equal += bits_of(static_cast<float>(d)) == s.word(i, 1) ? 1 : 0;
    }
    return equal;
}
}  // namespace tc_public

TEST_CASE("the tf32 unit models reproduce every vendored public tf32 vector", "[tensor_core][public][tf32]")
{
    using namespace tc_public;
    check_lines<tc::a100_tf32, float>("A100", "tf32", "fp32");
    check_lines<tc::a2_tf32, float>("A2", "tf32", "fp32");
    check_lines<tc::ada_tf32, float>("Ada", "tf32", "fp32");
    check_lines<tc::ada_tf32, float>("L40S", "tf32", "fp32");
    check_lines<tc::h100_tf32, float>("H100", "tf32", "fp32");
    check_lines<tc::h200_tf32, float>("H200", "tf32", "fp32");
    check_lines<tc::b200_tf32, float>("B200", "tf32", "fp32");
}

TEST_CASE("the float16-accumulator unit models reproduce every vendored public vector", "[tensor_core][public][f16acc]")
{
    using namespace tc_public;
    using half = Eigen::half;
    check_lines<tc::v100_hmma_f16acc, half>("V100", "fp16", "fp16");
    check_lines<tc::a100_hmma_f16acc, half>("A100", "fp16", "fp16");
    check_lines<tc::a2_hmma_f16acc, half>("A2", "fp16", "fp16");
    check_lines<tc::ada_hmma_f16acc, half>("Ada", "fp16", "fp16");
    check_lines<tc::ada_hmma_f16acc, half>("L40S", "fp16", "fp16");
    check_lines<tc::ada_qmma_f16acc, float8_e4m3fn>("Ada", "E4M3", "fp16");
    check_lines<tc::ada_qmma_f16acc, float8_e5m2>("Ada", "E5M2", "fp16");
    check_lines<tc::h100_hmma_f16acc, half>("H100", "fp16", "fp16");
    check_lines<tc::h200_hmma_f16acc, half>("H200", "fp16", "fp16");
    check_lines<tc::b200_hmma_f16acc, half>("B200", "fp16", "fp16");
}

TEST_CASE("the tf32 and float16-accumulator captures pin F, K and the rounding", "[tensor_core][public][tf32][f16acc]")
{
    using namespace tc_public;
    using half = Eigen::half;
    // The counts docs/tensor_core.md quotes. tf32: F one off, the sum rounded to nearest, P = 23.
    const vector_set a100 = read_result_set("A100", "tf32", "fp32");
    CHECK(match_lines<tf32_variant<23, 24, 4>, float>(a100).equal == 952);
    CHECK(match_lines<tf32_variant<25, 24, 4>, float>(a100).equal == 1134);
    CHECK(match_lines<tf32_variant<24, 24, 4, tc::nearest_result_rules>, float>(a100).equal == 970);
    CHECK(match_lines<tf32_variant<24, 24, 2>, float>(a100).equal == 1035);
    const vector_set h100 = read_result_set("H100", "tf32", "fp32");
    CHECK(match_lines<tf32_variant<24, 24, 4>, float>(h100).equal == 1130);
    CHECK(match_lines<tf32_variant<26, 24, 4>, float>(h100).equal == 1208);
    CHECK(match_lines<tf32_variant<25, 24, 4, tc::nearest_result_rules>, float>(h100).equal == 920);
    // Every captured tf32 operand is a tf32 value (low 13 bits zero): truncating and rounding
    // read the same numbers, so the capture cannot tell them apart.
    CHECK(match_lines<tf32_variant<24, 24, 4, tc::h100_rules, tc::tf32_input::nearest_even>, float>(a100).equal == 1250);
    CHECK(match_lines<tf32_variant<25, 24, 8, tc::h100_rules, tc::tf32_input::nearest_even>, float>(h100).equal == 1250);
    for (std::size_t i = 0; i < h100.lines; ++i)
        for (std::size_t kk = 0; kk < h100.k; ++kk)
            REQUIRE((bits_of(operand_of<float>(h100, i, 0, kk)) & 0x1fffu) == 0u);
    // float16 accumulator: cutting toward zero instead of rounding, half the block.
    const vector_set v100 = read_result_set("V100", "fp16", "fp16");
    CHECK(match_lines<f16acc_variant<23, 4, tc::same_type_of<half>, tc::h100_rules>, half>(v100).equal == 626);
    CHECK(match_lines<f16acc_variant<23, 2, tc::same_type_of<half>>, half>(v100).equal == 922);
    const vector_set b200 = read_result_set("B200", "fp16", "fp16");
    CHECK(match_lines<f16acc_variant<25, 16, tc::same_type_of<half>, tc::h100_rules>, half>(b200).equal == 637);
    CHECK(match_lines<f16acc_variant<25, 8, tc::same_type_of<half>>, half>(b200).equal == 920);
    // Ada's fp8 unit splits 32 into two blocks with a float16 accumulator too.
    const vector_set ada = read_result_set("Ada", "E4M3", "fp16");
    CHECK(match_lines<f16acc_variant<13, 32, fp8_pairs>, float8_e4m3fn>(ada).equal == 951);
    CHECK(match_lines<f16acc_variant<13, 16, fp8_pairs, tc::h100_rules>, float8_e4m3fn>(ada).equal == 523);
}

TEST_CASE("the H100, H200 and B200 fp8 sets with a float16 accumulator: no rule found", "[tensor_core][public][f16acc]")
{
    using namespace tc_public;
    // Not modelled (docs/tensor_core.md): the fused rule of the float32 units with a float16
    // result (MMA-Sim's, the MATLAB models') reproduces about two thirds of the lines; summing
    // the products first and adding C in float16 about four fifths.
    struct expected {
        const char* gpu;
        const char* format;
        std::size_t fused_f13, fused_f25, products_first;
    };
    for (const expected& e : {expected{"H100", "E4M3", 785, 790, 987}, expected{"H100", "E5M2", 848, 846, 1044},
                              expected{"H200", "E4M3", 795, 792, 982}, expected{"H200", "E5M2", 853, 846, 1051},
                              expected{"B200", "E4M3", 785, 790, 985}, expected{"B200", "E5M2", 836, 851, 1055}}) {
        const vector_set s = read_result_set(e.gpu, e.format, "fp16");
        INFO(e.gpu << " " << e.format);
        if (std::string(e.format) == "E4M3") {
            CHECK(match_lines<f16acc_variant<13, 32, fp8_pairs>, float8_e4m3fn>(s).equal == e.fused_f13);
            CHECK(match_lines<f16acc_variant<25, 32, fp8_pairs>, float8_e4m3fn>(s).equal == e.fused_f25);
            CHECK(products_then_c<float8_e4m3fn>(s) == e.products_first);
        } else {
            CHECK(match_lines<f16acc_variant<13, 32, fp8_pairs>, float8_e5m2>(s).equal == e.fused_f13);
            CHECK(match_lines<f16acc_variant<25, 32, fp8_pairs>, float8_e5m2>(s).equal == e.fused_f25);
            CHECK(products_then_c<float8_e5m2>(s) == e.products_first);
        }
    }
}

TEST_CASE("tf32 units read float operands as tf32; float16 accumulators round once", "[tensor_core][public][tf32][f16acc]")
{
    using namespace tc_public;
    using half = Eigen::half;
    constexpr float inf = std::numeric_limits<float>::infinity();
    // Truncation: 1 + 2^-11 is 1 in tf32 (10 mantissa bits); the nearest-even reading rounds
    // 1 + 3 * 2^-12 up to 1 + 2^-10.
    std::array<float, 4> a{1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-12f, 0.0f, 0.0f}, b{1.0f, 1.0f, 0.0f, 0.0f};
    CHECK(tc::dot<tc::a100_tf32>(a, b, 0.0f) == 2.0f);
    CHECK(tc::dot<tf32_variant<24, 24, 4, tc::h100_rules, tc::tf32_input::nearest_even>>(a, b, 0.0f) == 2.0f + 0x1p-10f);
    // A float32 subnormal operand is a tf32 subnormal: its low 13 bits go too.
    a = {0x1p-130f + 0x1p-149f, 0.0f, 0.0f, 0.0f};
    b = {0x1p100f, 0.0f, 0.0f, 0.0f};
    CHECK(tc::dot<tc::a100_tf32>(a, b, 0.0f) == 0x1p-30f);
    // A NaN whose payload lies in the dropped bits stays NaN; inf * 0 is NaN.
    a = {std::bit_cast<float>(0x7f800001u), 0.0f, 0.0f, 0.0f};
    CHECK(bits_of(tc::dot<tc::a100_tf32>(a, b, 0.0f)) == 0x7fffffffu);
    a = {inf, 0.0f, 0.0f, 0.0f};
    CHECK(tc::dot<tc::a100_tf32>(a, b, 1.0f) == inf);
    // GEMM chains of tf32 units equal loops of their instruction (the reference engine).
    std::mt19937 rng(21);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto x = xt::xarray<float>::from_shape({3, 21});
    auto y = xt::xarray<float>::from_shape({21, 5});
    for (auto& e : x) e = normal(rng);
    for (auto& e : y) e = normal(rng);
    const xt::xarray<float> d = tc::gemm<tc::h100_tf32_chain>(x, y);
    std::vector<float> row(24, 0.0f), column(24, 0.0f);
    for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t j = 0; j < 5; ++j) {
            for (std::size_t p = 0; p < 21; ++p) {
                row[p] = x(i, p);
                column[p] = y(p, j);
            }
            float acc = 0.0f;
            for (std::size_t first = 0; first < 24; first += 8) {
                acc = tc::dot<tc::h100_tf32>(std::span<const float>(row).subspan(first, 8),
                                             std::span<const float>(column).subspan(first, 8), acc);
            }
            CHECK(bits_of(d(i, j)) == bits_of(acc));
            CHECK(bits_of(tc::gemm_dot<tc::h100_tf32_chain>(std::span<const float>(row).first(21),
                                                            std::span<const float>(column).first(21))) == bits_of(acc));
        }
    }
    const xt::xarray<float> d4 = tc::gemm<tc::a100_tf32_chain>(x, y);
    std::vector<float> on_grid(15, -1.0f);
    tc::detail::gemm_into_on_grid<tc::a100_tf32_chain, float, float>(x.data(), y.data(), 3, 21, 5, on_grid.data());
    for (std::size_t i = 0; i < 15; ++i) CHECK(bits_of(on_grid[i]) == bits_of(d4.data()[i]));

    // float16 accumulator: 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even (1); 1 + 3 * 2^-11
    // rounds up to 1 + 2^-9; the float32 unit keeps 1 + 3 * 2^-11.
    std::array<half, 16> h{}, g{};
    h[0] = half(0x1p-11f);
    g[0] = half(1.0f);
    CHECK(static_cast<float>(tc::dot<tc::h100_hmma_f16acc>(h, g, half(1.0f))) == 1.0f);
    h[0] = half(3 * 0x1p-11f);
    CHECK(static_cast<float>(tc::dot<tc::h100_hmma_f16acc>(h, g, half(1.0f))) == 1.0f + 0x1p-9f);
    CHECK(tc::dot<tc::h100_hmma>(h, g, 1.0f) == 1.0f + 3 * 0x1p-11f);
    // Subnormal results land on the 2^-24 grid, rounded once: 2^-12 * 2^-13 = 2^-25 is a tie
    // (to 0, even), 3 * 2^-26 rounds up to 2^-24; 65520 overflows to inf; NaN is 0x7fff.
    h[0] = half(0x1p-12f);
    g[0] = half(0x1p-13f);
    CHECK(std::bit_cast<std::uint16_t>(tc::dot<tc::h100_hmma_f16acc>(h, g, half(0.0f))) == 0u);
    h[0] = half(3 * 0x1p-14f);
    g[0] = half(0x1p-12f);
    CHECK(std::bit_cast<std::uint16_t>(tc::dot<tc::h100_hmma_f16acc>(h, g, half(0.0f))) == 1u);
    h[0] = half(32768.0f);
    g[0] = half(1.0f);
    h[1] = half(32752.0f);
    g[1] = half(1.0f);
    CHECK(static_cast<float>(tc::dot<tc::h100_hmma_f16acc>(h, g, half(0.0f))) == inf);
    h[1] = half(32736.0f);
    CHECK(static_cast<float>(tc::dot<tc::h100_hmma_f16acc>(h, g, half(0.0f))) == 65504.0f);
    h[0] = half(inf);
    g[0] = half(0.0f);
    CHECK(std::bit_cast<std::uint16_t>(tc::dot<tc::h100_hmma_f16acc>(h, g, half(0.0f))) == 0x7fffu);
    std::array<float8_e4m3fn, 16> p{}, q{};
    p[0] = float8_e4m3fn(448.0f);
    q[0] = float8_e4m3fn(-448.0f);
    CHECK(static_cast<float>(tc::dot<tc::ada_qmma_f16acc>(p, q, half(0.0f))) == -inf);  // -200704 overflows float16
}

namespace tc_public {
/// A tf32 chain reading its operands to nearest even.
struct tf32_nearest_unit : tc::inner_product_model<25, 24, 8, tc::tf32_operands<tc::tf32_input::nearest_even>> {
    static constexpr const char* name = "tf32_nearest_unit";
};
struct tf32_nearest_chain : tc::gemm_model<tf32_nearest_unit, 0> {
    static constexpr const char* name = "tf32_nearest_chain";
};

/// gemm<Model> over float data (lanes where the data allow, the engine otherwise) against
/// gemm_dot<Model> (the engine) per output, bit for bit.
template <tc::GemmModel Model>
void check_tf32_chain(const xt::xarray<float>& a, const xt::xarray<float>& b)
{
    const std::size_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
    const xt::xarray<float> d = tc::gemm<Model>(a, b);
    const std::size_t mismatches = m * n - scalify::testing::outputs_agreeing_with_gemm_dot<Model>(d, a, b);
    INFO(Model::name << " " << m << "x" << k << "x" << n);
    CHECK(mismatches == 0);
}
}  // namespace tc_public

TEST_CASE("the tf32 chains in lanes equal the reference engine", "[tensor_core][public][tf32][gemm]")
{
    using namespace tc_public;
    std::mt19937 rng(31);
    // Random float32 bit patterns of moderate exponents, low mantissa bits set (so truncation and
    // rounding differ), a sixteenth zero, both signs: the lanes' data.
    std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7fffff);
    std::uniform_int_distribution<int> field(127 - 20, 127 + 20), pick(0, 15);
    const auto fill = [&](xt::xarray<float>& x) {
        for (auto& e : x) {
            const std::uint32_t sign = pick(rng) < 8 ? 0x80000000u : 0u;
            e = pick(rng) == 0 ? 0.0f : std::bit_cast<float>(sign | static_cast<std::uint32_t>(field(rng)) << 23 | mantissa(rng));
        }
    };
    auto a = xt::xarray<float>::from_shape({5, 45});
    auto b = xt::xarray<float>::from_shape({45, 37});
    fill(a);
    fill(b);
    check_tf32_chain<tc::a100_tf32_chain>(a, b);
    check_tf32_chain<tc::h100_tf32_chain>(a, b);
    check_tf32_chain<tf32_nearest_chain>(a, b);
    // A value just below a power of two rounds up to it under nearest_even.
    a(0, 0) = std::bit_cast<float>(0x3fffffffu);
    check_tf32_chain<tf32_nearest_chain>(a, b);
    // NaN and inf operands: the outputs they reach go through the engine.
    a(1, 3) = std::numeric_limits<float>::quiet_NaN();
    b(7, 2) = -std::numeric_limits<float>::infinity();
    b(8, 30) = std::bit_cast<float>(0x7f800001u);  // a NaN whose payload tf32 drops
    check_tf32_chain<tc::a100_tf32_chain>(a, b);
    check_tf32_chain<tc::ada_tf32_chain>(a, b);
    check_tf32_chain<tf32_nearest_chain>(a, b);
    // Out of the lanes' range: a float32 subnormal, a huge value; the whole product runs the engine.
    fill(a);
    a(2, 2) = 0x1p-140f + 0x1p-149f;
    check_tf32_chain<tc::b200_tf32_chain>(a, b);
    fill(a);
    a(4, 44) = 0x1.fffffep+127f;
    check_tf32_chain<tc::h100_tf32_chain>(a, b);
}

TEST_CASE("a float16 accumulator joins with its value's exponent, a float16 operand with its nominal one",
          "[tensor_core][public][f16acc]")
{
    using namespace tc_public;
    using half = Eigen::half;
    // 2^-20, a float16 subnormal: as an operand its exponent is the nominal -14, as C floor(log2).
    CHECK(tc::detail::decompose(half(0x1p-20f)).exponent == -14);
    CHECK(tc::detail::decompose_accumulator(half(0x1p-20f)).exponent == -20);
    // The products 2^-20 * 1 (nominal exponent -14) and 2^-24 * 2^-16 = 2^-40 (nominal -28): the
    // units are 2^(-14 - 25) = 2^-39, so 2^-40 is cut (it would stay at floor(log2) exponents).
    std::array<half, 16> h{}, g{};
    h[0] = half(0x1p-20f);
    g[0] = half(1.0f);
    h[1] = half(0x1p-24f);
    g[1] = half(0x1p-16f);
    CHECK(tc::dot<tc::h100_hmma>(h, g, 0.0f) == 0x1p-20f);
}
