// scalify::math::exp and erf (numeric/math.hpp): their error against libm's double functions on a
// strided sweep of all float32 inputs and a dense one where the results are not 0, 1 or inf, the
// special values, and the exact bits of a few results, the same on every CPU (this file runs on
// x86-64 and, in cmake/cross_test.cmake, on ARM64): a change of ISA, compiler flag or libm that
// moved one bit fails here. The ops that use them (gelu, gelu_vjp, exp, softmax) give their bits.
#include <scalify/numeric/math.hpp>
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace math_test {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

/// |y - exact| in units of the float32 ulp at exact (2^-149 below the normal range).
double ulp_error(float y, double exact)
{
    const double magnitude = std::fabs(exact);
    const double ulp = magnitude < 0x1p-126 ? 0x1p-149 : std::ldexp(1.0, std::ilogb(magnitude) - 23);
    return std::fabs(double(y) - exact) / ulp;
}

/// The largest ulp error of exp and erf over `count` inputs from `first` in steps of `step`
/// float32 codes (wrapping around).
struct sweep_result {
    double exp = 0, erf = 0;
    float worst_exp = 0, worst_erf = 0;
};
sweep_result sweep(std::uint32_t first, std::uint32_t step, std::uint32_t count)
{
    sweep_result r;
    std::uint32_t code = first;
    for (std::uint32_t i = 0; i < count; ++i, code += step) {
        const float x = std::bit_cast<float>(code);
        if (x != x) continue;
        const double e = std::exp(double(x));
        const float ours = scalify::math::exp(x);
        if (e > double(std::numeric_limits<float>::max())) {
            // libm's double result rounds to inf as float32 from (2 - 2^-24) 2^127 on
            if (e >= 0x1.ffffffp127 && ours != inf) r.exp = inf, r.worst_exp = x;
        } else if (const double error = ulp_error(ours, e); error > r.exp) {
            r.exp = error, r.worst_exp = x;
        }
        if (const double error = ulp_error(scalify::math::erf(x), std::erf(double(x))); error > r.erf) r.erf = error, r.worst_erf = x;
    }
    return r;
}

/// FNV-1a over the result bits of exp and erf at every 65537th float32 code.
std::uint64_t result_hash()
{
    std::uint64_t h = 1469598103934665603ull;
    for (std::uint64_t i = 0; i < (1ull << 32); i += 65537) {
        const float x = std::bit_cast<float>(static_cast<std::uint32_t>(i));
        h = (h ^ bits(scalify::math::exp(x))) * 1099511628211ull;
        h = (h ^ bits(scalify::math::erf(x))) * 1099511628211ull;
    }
    return h;
}

}  // namespace math_test

TEST_CASE("math::exp and math::erf: error against libm's double functions", "[math]")
{
    // all float32 codes, every 8191st (odd: every low mantissa pattern), and every 2039th code of
    // [0.25, 4] and of [-4, -0.25] (where erf and exp are neither 0, 1 nor inf); the bounds hold
    // on every float32 input (docs/ops.md)
    const math_test::sweep_result all = math_test::sweep(0, 8191, static_cast<std::uint32_t>((1ull << 32) / 8191));
    CAPTURE(all.worst_exp, all.worst_erf);
    CHECK(all.exp <= 1.0);
    CHECK(all.erf <= 2.0);
    for (const float start : {0.25f, -0.25f}) {
        const std::uint32_t first = math_test::bits(start), count = (math_test::bits(4.0f) - math_test::bits(0.25f)) / 2039;
        const math_test::sweep_result dense = math_test::sweep(first, 2039, count);
        CAPTURE(start, dense.worst_exp, dense.worst_erf);
        CHECK(dense.exp <= 1.0);
        CHECK(dense.erf <= 2.0);
    }
}

TEST_CASE("math::exp: special values, overflow and underflow", "[math]")
{
    using scalify::math::exp;
    CHECK(exp(0.0f) == 1.0f);
    CHECK(exp(-0.0f) == 1.0f);
    CHECK(exp(math_test::inf) == math_test::inf);
    CHECK(math_test::bits(exp(-math_test::inf)) == 0u);
    CHECK(std::isnan(exp(math_test::qnan)));
    CHECK(std::isnan(exp(-math_test::qnan)));
    // the float32 neighbours of each threshold, on its two sides (as libm's double exp rounds)
    CHECK(exp(88.7228317f) == 0x1.ffff08p+127f);  // the largest finite result
    CHECK(exp(88.7228394f) == math_test::inf);
    CHECK(exp(1000.0f) == math_test::inf);
    CHECK(exp(-87.3365402f) == 0x1.00004cp-126f);  // e^-87.33654475 = 2^-126
    CHECK(exp(-87.3365479f) == 0x1.ffff98p-127f);  // subnormal, rounded once
    CHECK(math_test::bits(exp(-103.27893f)) == 1u);   // 2^-149
    CHECK(math_test::bits(exp(-103.972076f)) == 1u);  // above 2^-150: 2^-149
    CHECK(math_test::bits(exp(-103.972084f)) == 0u);  // below: 0
    CHECK(math_test::bits(exp(-1000.0f)) == 0u);
}

TEST_CASE("math::erf: special values and saturation", "[math]")
{
    using scalify::math::erf;
    CHECK(math_test::bits(erf(0.0f)) == 0u);
    CHECK(math_test::bits(erf(-0.0f)) == 0x80000000u);
    CHECK(erf(math_test::inf) == 1.0f);
    CHECK(erf(-math_test::inf) == -1.0f);
    CHECK(std::isnan(erf(math_test::qnan)));
    CHECK(erf(0x1p-149f) == 0x1p-149f);  // 2/sqrt(pi) * 2^-149 rounds to 2^-149
    CHECK(erf(0x1p-130f) == 0x1.20dd8p-130f);   // 2/sqrt(pi) 2^-130 = 0x1.20dd75p-130, rounded
    CHECK(erf(3.9192059f) == 1.0f);              // erf rounds to 1 from here on (erfc < 2^-25)
    CHECK(erf(3.91920567f) == 0x1.fffffep-1f);   // and not below
    CHECK(erf(-3.9192059f) == -1.0f);
    CHECK(erf(100.0f) == 1.0f);
    for (const float x : {0.5f, 0.99999994f, 1.0f, 2.5f, 3.5f}) CHECK(erf(-x) == -erf(x));  // odd
}

TEST_CASE("math::exp and math::erf: the same bits on every CPU", "[math]")
{
    struct expected {
        float x;
        std::uint32_t exp, erf;
    };
    // {x, exp(x) bits, erf(x) bits}, from x86-64 (SSE2, AVX2, AVX-512, -ffp-contract=fast and off,
    // g++ 12 and clang 14) and ARM64 (g++ 12), all alike
    const expected table[] = {
        {-0x1.8p+1f, 0x3d4bed86u, 0xbf7ffe8du},   {-0x1p-1f, 0x3f1b4598u, 0xbf053f7bu},
        {0x1p-20f, 0x3f800008u, 0x35906ebau},     {0x1.99999ap-4f, 0x3f8d763eu, 0x3de652f5u},
        {0x1p-1f, 0x3fd3094cu, 0x3f053f7bu},      {0x1.fffffcp-1f, 0x402df853u, 0x3f57bb3cu},
        {0x1p+0f, 0x402df854u, 0x3f57bb3eu},      {0x1.8p+0f, 0x408f69ffu, 0x3f7752abu},
        {0x1p+1f, 0x40ec7326u, 0x3f7ecd71u},      {0x1.8p+1f, 0x41a0af2eu, 0x3f7ffe8du},
        {0x1.f33334p+1f, 0x42459c1du, 0x3f7fffffu}, {0x1.4p+3f, 0x46ac14eeu, 0x3f800000u},
        {0x1.6p+6f, 0x7ef882b7u, 0x3f800000u},    {-0x1.5ep+6f, 0x006cb2bcu, 0xbf800000u},
        {-0x1.9p+6f, 0x0000001bu, 0xbf800000u},   {0x1.62e43p-2f, 0x3fb504f3u, 0x3ec07d7eu},
        {0x1.3c0ca2p+0f, 0x405bf60cu, 0x3f6b4f52u},
    };
    for (const auto& e : table) {
        CAPTURE(e.x);
        CHECK(math_test::bits(scalify::math::exp(e.x)) == e.exp);
        CHECK(math_test::bits(scalify::math::erf(e.x)) == e.erf);
    }
    CHECK(math_test::result_hash() == 0x33f1cc926d86e31bull);  // 65537 results of each
    // constexpr: the compiler's own evaluation gives the same bits
    static_assert(std::bit_cast<std::uint32_t>(scalify::math::exp(0.5f)) == 0x3fd3094cu);
    static_assert(std::bit_cast<std::uint32_t>(scalify::math::erf(1.0f)) == 0x3f57bb3eu);
}

TEST_CASE("math: gelu, gelu_vjp, exp and softmax compute with scalify's erf and exp", "[math]")
{
    using namespace scalify;
    xt::xarray<float> data = {-3.0f, -0.75f, -0.1f, 0.0f, 0.3f, 1.25f, 2.5f, 4.0f};
    const ScaledArray<float, pow2_scale> x(data, 0.5f);
    const auto g = gelu(x);
    const auto e = scalify::exp(x);
    const auto d = gelu_vjp(ScaledArray<float, pow2_scale>(xt::ones<float>({8}), 1.0f), x);
    const auto p = softmax(x, 0);
    float part[8];  // softmax's documented order: element i in running sum i mod 8 (max 4 * 0.5)
    for (std::size_t i = 0; i < 8; ++i) part[i] = math::exp(data(i) * 0.5f - 2.0f);
    const float total = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    for (std::size_t i = 0; i < 8; ++i) {
        const float v = data(i) * 0.5f;
        CAPTURE(v);
        CHECK(g.value()(i) == 0.5f * v * (1.0f + math::erf(v * 0.70710678f)));
        CHECK(e.value()(i) == math::exp(v));
        const float pdf = math::exp(-0.5f * v * v) * 0.39894228f;
        CHECK(d.value()(i) == 0.5f * (1.0f + math::erf(v * 0.70710678f)) + detail::rounded_product(v, pdf));
        CHECK(p.value()(i) == math::exp(v - 2.0f) / total);
    }
}
