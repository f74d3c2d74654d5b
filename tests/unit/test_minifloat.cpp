// minifloat<Format>: decode of every code, targeted rounding cases, limits, traits, printing.
#include "../support/reference_tables.hpp"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <unordered_set>

using namespace scalify;

namespace {

template <class T>
T code(unsigned bits)
{
    return T::from_bits(static_cast<typename T::storage_type>(bits));
}

template <class T>
std::uint32_t float_bits(T x)
{
    return std::bit_cast<std::uint32_t>(static_cast<float>(x));
}

bool same_float(std::uint32_t got, std::uint32_t expected)
{
    const float g = std::bit_cast<float>(got), e = std::bit_cast<float>(expected);
    return (std::isnan(g) && std::isnan(e)) || got == expected;
}

template <class T>
void check_decode_table(const std::string& file)
{
    const auto expected = test::read_decode("fp8/" + file);
    REQUIRE(expected.size() == 256);
    const unsigned codes = 1u << T::format::total_bits;
    // fp6/fp4 tables list 256 bytes; only the format's own codes (the low total_bits bits) are defined.
    for (unsigned c = 0; c < codes; ++c) {
        INFO("code 0x" << std::hex << c);
        CHECK(same_float(float_bits(code<T>(c)), expected[c]));
    }
}

}  // namespace

TEST_CASE("every code decodes to ml_dtypes' float32 value", "[decode]")
{
    check_decode_table<float8_e4m3fn>("decode_e4m3fn.txt");
    check_decode_table<float8_e5m2>("decode_e5m2.txt");
    check_decode_table<float8_e4m3fnuz>("decode_e4m3fnuz.txt");
    check_decode_table<float8_e5m2fnuz>("decode_e5m2fnuz.txt");
    check_decode_table<float8_e4m3b11fnuz>("decode_e4m3b11fnuz.txt");
    check_decode_table<float8_e3m4>("decode_e3m4.txt");
    check_decode_table<float8_e4m3>("decode_e4m3.txt");
    check_decode_table<float8_e8m0fnu>("decode_e8m0fnu.txt");
    check_decode_table<float6_e2m3fn>("decode_e2m3fn.txt");
    check_decode_table<float6_e3m2fn>("decode_e3m2fn.txt");
    check_decode_table<float4_e2m1fn>("decode_e2m1fn.txt");
}

TEST_CASE("e4m3fn and e5m2 decode as the H100 does", "[decode]")
{
    std::ifstream in(test::data_path("fp8/decode_hw_e4m3fn_e5m2.txt"));
    std::string line;
    unsigned rows = 0;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream fields(line);
        unsigned c = 0;
        std::uint32_t e4m3 = 0, e5m2 = 0;
        fields >> std::hex >> c >> e4m3 >> e5m2;
        INFO("code 0x" << std::hex << c);
        CHECK(same_float(float_bits(code<float8_e4m3fn>(c)), e4m3));
        CHECK(same_float(float_bits(code<float8_e5m2>(c)), e5m2));
        ++rows;
    }
    CHECK(rows == 256);
}

TEST_CASE("all 65536 float16 inputs saturate as H100 cvt.rn.satfinite.f16x2", "[convert][float16]")
{
    auto check = [](auto tag, const std::string& file) {
        using T = decltype(tag);
        const auto runs = test::read_runs("fp8/" + file);
        test::run_cursor cursor(runs);
        std::vector<unsigned> expected;
        cursor.fill(0, 65536, expected);
        unsigned mismatches = 0;
        for (unsigned bits = 0; bits < 65536; ++bits) {
            const Eigen::half h = float_traits<Eigen::half>::from_bits(static_cast<std::uint16_t>(bits));
            const T got = convert<T, round_nearest_even, saturate_finite>(h);
            const bool ok = Eigen::numext::isnan(h) ? isnan(got) : got.bits() == expected[bits];
            mismatches += ok ? 0 : 1;
        }
        CHECK(mismatches == 0);
    };
    check(float8_e4m3fn{}, "f16_to_e4m3fn.satfinite.txt");
    check(float8_e5m2{}, "f16_to_e5m2.satfinite.txt");
}

TEST_CASE("targeted rounding cases", "[convert]")
{
    SECTION("ties go to even")
    {
        CHECK(float8_e4m3fn(1.0625f).bits() == 0x38);  // 1 | 1.125 -> 1
        CHECK(float8_e4m3fn(1.1875f).bits() == 0x3a);  // 1.125 | 1.25 -> 1.25
        CHECK(float8_e5m2(1.125f).bits() == 0x3c);     // 1 | 1.25 -> 1
        CHECK(float8_e5m2(1.375f).bits() == 0x3e);     // 1.25 | 1.5 -> 1.5
    }
    SECTION("subnormal boundaries")
    {
        const float denorm_min = std::ldexp(1.0f, -9);
        CHECK(float8_e4m3fn(denorm_min).bits() == 0x01);
        CHECK(float8_e4m3fn(denorm_min / 2).bits() == 0x00);                      // tie with 0 -> 0
        CHECK(float8_e4m3fn(std::nextafter(denorm_min / 2, 1.0f)).bits() == 0x01);
        CHECK(float8_e4m3fn(std::ldexp(1.0f, -6)).bits() == 0x08);                 // smallest normal
        CHECK(float8_e4m3fn(std::ldexp(15.5f, -10)).bits() == 0x08);               // 7.75 ulps rounds into it
        CHECK(float8_e5m2(std::ldexp(1.0f, -16)).bits() == 0x01);
    }
    SECTION("max and the overflow threshold")
    {
        CHECK(float8_e4m3fn(448.0f).bits() == 0x7e);
        CHECK(float8_e4m3fn(464.0f).bits() == 0x7e);  // tie with the (absent) 480 -> even 448
        CHECK(isnan(float8_e4m3fn(std::nextafter(464.0f, 1000.0f))));
        CHECK(convert<float8_e4m3fn, round_nearest_even, saturate_finite>(1e30f).bits() == 0x7e);
        CHECK(convert<float8_e4m3fn, round_nearest_even, saturate_finite>(-1e30f).bits() == 0xfe);
        CHECK(float8_e5m2(57344.0f).bits() == 0x7b);
        CHECK(isinf(float8_e5m2(61440.0f)));  // tie with inf -> inf (inf's mantissa is even)
        CHECK(float8_e5m2(std::nextafter(61440.0f, 0.0f)).bits() == 0x7b);
    }
    SECTION("zeros, infinities, NaN")
    {
        CHECK(float8_e4m3fn(0.0f).bits() == 0x00);
        CHECK(float8_e4m3fn(-0.0f).bits() == 0x80);
        CHECK(float8_e4m3fnuz(-0.0f).bits() == 0x00);  // no negative zero
        CHECK(isinf(float8_e5m2(INFINITY)));
        CHECK(float8_e5m2(-INFINITY).bits() == 0xfc);
        CHECK(isnan(float8_e4m3fn(INFINITY)));  // no inf: overflow is NaN without saturation
        CHECK(convert<float8_e5m2, round_nearest_even, saturate_finite>(INFINITY).bits() == 0x7b);
        CHECK(float8_e4m3fn(NAN).bits() == 0x7f);  // documented NaN codes
        CHECK(float8_e4m3fn(-NAN).bits() == 0xff);
        CHECK(float8_e5m2(NAN).bits() == 0x7f);
        CHECK(float8_e4m3fnuz(NAN).bits() == 0x80);
        CHECK(float8_e8m0fnu(NAN).bits() == 0xff);
        CHECK(float4_e2m1fn(NAN).bits() == 0x0);  // no NaN in the format: zero with the NaN's sign
        CHECK(float4_e2m1fn(-NAN).bits() == 0x8);
        CHECK(float4_e2m1fn(INFINITY).bits() == 0x7);  // finite-only formats saturate
    }
    SECTION("e8m0fnu: powers of two, no zero, no sign")
    {
        CHECK(float8_e8m0fnu(1.0f).bits() == 127);
        CHECK(float8_e8m0fnu(1.5f).bits() == 128);  // ties away (ml_dtypes)
        CHECK(isnan(float8_e8m0fnu(0.0f)));
        CHECK(isnan(float8_e8m0fnu(-1.0f)));
    }
    SECTION("doubles round once, not twice through float")
    {
        // 1.0625 + 2^-40 is above the e4m3fn tie; through float it would become the tie itself.
        const double just_above_tie = 1.0625 + std::ldexp(1.0, -40);
        CHECK(static_cast<double>(static_cast<float>(just_above_tie)) == 1.0625);
        CHECK(float8_e4m3fn(just_above_tie).bits() == 0x39);
        CHECK(float8_e4m3fn(1.0625 - std::ldexp(1.0, -40)).bits() == 0x38);
        CHECK(convert<float8_e5m2, round_toward_zero>(1.2499999999).bits() == 0x3c);
    }
    SECTION("toward zero truncates; overflow follows the saturation policy")
    {
        CHECK(convert<float8_e4m3fn, round_toward_zero>(1.124f).bits() == 0x38);
        CHECK(convert<float8_e4m3fn, round_toward_zero>(-1.124f).bits() == 0xb8);
        CHECK(convert<float8_e4m3fn, round_toward_zero>(479.0f).bits() == 0x7e);
        CHECK(isnan(convert<float8_e4m3fn, round_toward_zero>(480.0f)));
        CHECK(convert<float8_e4m3fn, round_toward_zero, saturate_finite>(480.0f).bits() == 0x7e);
    }
    SECTION("between formats and from Eigen's 16-bit types")
    {
        CHECK(convert<float8_e4m3fn>(float8_e5m2(0.75f)).bits() == float8_e4m3fn(0.75f).bits());
        CHECK(convert<float8_e5m2>(float8_e4m3fn(1.125f)).bits() == 0x3c);  // 1.125 -> tie -> 1
        CHECK(float8_e4m3fn(Eigen::half(2.0f)).bits() == 0x40);
        CHECK(convert<float>(float8_e4m3fn::from_bits(0x01)) == std::ldexp(1.0f, -9));
        CHECK(convert<double>(float8_e5m2::from_bits(0x7b)) == 57344.0);
        CHECK(float8_e4m3fn(3).bits() == 0x44);  // integers through double
    }
    SECTION("into Eigen::half and Eigen::bfloat16 with any policy")
    {
        const float x = 1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20);  // just above a half tie
        CHECK(static_cast<float>(convert<Eigen::half>(x)) == 1.0f + std::ldexp(1.0f, -10));
        CHECK(static_cast<float>(convert<Eigen::half, round_toward_zero>(x)) == 1.0f);
        CHECK(static_cast<float>(convert<Eigen::half, round_nearest_even, saturate_finite>(1e6f)) == 65504.0f);
        CHECK(static_cast<float>(convert<Eigen::bfloat16, round_toward_zero>(1.0f + std::ldexp(1.0f, -8))) == 1.0f);
        for (float v : {0.1f, -3.7f, 1e-6f, 65519.0f, 65520.0f, 1e-8f}) {
            CHECK(convert<Eigen::half>(v).x == Eigen::half(v).x);
            CHECK(convert<Eigen::bfloat16>(v).value == Eigen::bfloat16(v).value);
        }
    }
}

TEMPLATE_TEST_CASE("numeric_limits follow the standard's definitions", "[limits]", float8_e4m3fn, float8_e5m2,
                   float8_e4m3fnuz, float8_e5m2fnuz, float8_e4m3b11fnuz, float8_e3m4, float8_e4m3, float8_e8m0fnu,
                   float6_e2m3fn, float6_e3m2fn, float4_e2m1fn)
{
    using L = std::numeric_limits<TestType>;
    using F = typename TestType::format;
    STATIC_REQUIRE(L::is_specialized);
    STATIC_REQUIRE(L::digits == F::mantissa_bits + 1);
    // min() is the smallest normal: 2^(min_exponent - 1); max() = (2 - 2^-M ... ) 2^(max_exponent - 1).
    CHECK(static_cast<float>(L::min()) == std::ldexp(1.0f, L::min_exponent - 1));
    CHECK(static_cast<float>((L::max)()) < std::ldexp(1.0f, L::max_exponent));
    CHECK(static_cast<float>((L::max)()) >= std::ldexp(1.0f, L::max_exponent - 1));
    CHECK(static_cast<float>(L::epsilon()) == std::ldexp(1.0f, -F::mantissa_bits));
    CHECK(static_cast<float>(L::denorm_min()) <= static_cast<float>(L::min()));
    CHECK(std::pow(10.0, L::min_exponent10) >= static_cast<double>(static_cast<float>(L::min())));
    CHECK(std::pow(10.0, L::max_exponent10) <= static_cast<double>(static_cast<float>((L::max)())));
    if constexpr (L::is_signed) CHECK(static_cast<float>(L::lowest()) == -static_cast<float>((L::max)()));
    if constexpr (L::has_infinity) CHECK(isinf(L::infinity()));
    if constexpr (L::has_quiet_NaN) CHECK(isnan(L::quiet_NaN()));
    // Every finite value round-trips through float exactly.
    for (unsigned c = 0; c < (1u << F::total_bits); ++c) {
        const auto x = code<TestType>(c);
        if (!isfinite(x)) continue;
        CHECK(TestType(static_cast<float>(x)) == x);
    }
}

TEST_CASE("published limits of the common formats", "[limits]")
{
    CHECK(static_cast<float>((std::numeric_limits<float8_e4m3fn>::max)()) == 448.0f);
    CHECK(static_cast<float>(std::numeric_limits<float8_e4m3fn>::min()) == std::ldexp(1.0f, -6));
    CHECK(static_cast<float>(std::numeric_limits<float8_e4m3fn>::denorm_min()) == std::ldexp(1.0f, -9));
    CHECK(static_cast<float>((std::numeric_limits<float8_e5m2>::max)()) == 57344.0f);
    CHECK(static_cast<float>(std::numeric_limits<float8_e5m2>::denorm_min()) == std::ldexp(1.0f, -16));
    CHECK(static_cast<float>((std::numeric_limits<float8_e4m3fnuz>::max)()) == 240.0f);
    CHECK(static_cast<float>((std::numeric_limits<float8_e4m3b11fnuz>::max)()) == 30.0f);
    CHECK(static_cast<float>((std::numeric_limits<float8_e3m4>::max)()) == 15.5f);
    CHECK(static_cast<float>((std::numeric_limits<float8_e4m3>::max)()) == 240.0f);
    CHECK(static_cast<float>((std::numeric_limits<float8_e8m0fnu>::max)()) == std::ldexp(1.0f, 127));
    CHECK(static_cast<float>(std::numeric_limits<float8_e8m0fnu>::min()) == std::ldexp(1.0f, -127));
    CHECK(static_cast<float>((std::numeric_limits<float6_e2m3fn>::max)()) == 7.5f);
    CHECK(static_cast<float>((std::numeric_limits<float6_e3m2fn>::max)()) == 28.0f);
    CHECK(static_cast<float>((std::numeric_limits<float4_e2m1fn>::max)()) == 6.0f);
}

TEST_CASE("arithmetic, comparison, classification", "[arithmetic]")
{
    const float8_e4m3fn a{1.5f}, b{2.0f};
    CHECK(static_cast<float>(a + b) == 3.5f);
    CHECK(static_cast<float>(a * b) == 3.0f);
    CHECK(static_cast<float>(b - a) == 0.5f);
    CHECK(static_cast<float>(b / a) == 1.375f);  // 1.333.. rounds to 1.375
    CHECK(static_cast<float>(-a) == -1.5f);
    float8_e4m3fn c = a;
    c += b;
    CHECK(c == float8_e4m3fn(3.5f));
    CHECK(a < b);
    CHECK(float8_e4m3fn(0.0f) == float8_e4m3fn(-0.0f));
    const auto nan = std::numeric_limits<float8_e4m3fn>::quiet_NaN();
    CHECK_FALSE(nan == nan);
    CHECK(isnan(abs(nan)));
    CHECK(static_cast<float>(abs(float8_e4m3fn(-2.0f))) == 2.0f);
    CHECK(signbit(float8_e4m3fn(-0.0f)));
    // fnuz: negating zero or the NaN must not swap them.
    CHECK((-float8_e4m3fnuz(0.0f)).bits() == 0x00);
    CHECK(isnan(-std::numeric_limits<float8_e4m3fnuz>::quiet_NaN()));
    CHECK(isnan(-float8_e8m0fnu(2.0f)));
    CHECK(isfinite(a));
    CHECK_FALSE(isfinite(float8_e5m2(INFINITY)));
}

TEST_CASE("hash agrees with ==, printing uses float formatting", "[io]")
{
    const std::hash<float8_e4m3fn> hash;
    CHECK(hash(float8_e4m3fn(0.0f)) == hash(float8_e4m3fn(-0.0f)));
    std::unordered_set<float8_e5m2> set{float8_e5m2(1.0f), float8_e5m2(2.0f), float8_e5m2(1.0f)};
    CHECK(set.size() == 2);
    CHECK(fmt::format("{}", float8_e4m3fn(448.0f)) == "448");
    CHECK(fmt::format("{:.2f}", float8_e5m2(0.375f)) == "0.38");
    std::ostringstream os;
    os << float8_e4m3fn(-1.75f);
    CHECK(os.str() == "-1.75");
}

TEST_CASE("Eigen matrices of minifloats", "[eigen]")
{
    Eigen::Matrix2f m;
    m << 1.0f, 2.5f, -3.0f, 500.0f;
    const Eigen::Matrix<float8_e4m3fn, 2, 2> q = m.cast<float8_e4m3fn>();
    const Eigen::Matrix2f back = q.cast<float>();
    CHECK(back(0, 1) == 2.5f);
    CHECK(std::isnan(back(1, 1)));  // 500 overflows e4m3fn without saturation
    const Eigen::Matrix<float8_e4m3fn, 2, 2> sum = q + q;
    CHECK(static_cast<float>(sum(1, 0)) == -6.0f);
}
