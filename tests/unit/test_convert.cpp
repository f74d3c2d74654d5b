// convert_n: lengths, decode, stochastic rounding statistics and reproducibility.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

using namespace scalify;

TEST_CASE("convert_n checks lengths and names both", "[convert_n]")
{
    std::vector<float> in(5, 1.0f);
    std::vector<float8_e4m3fn> out(4);
    CHECK_THROWS_MATCHES((convert_n<float8_e4m3fn>(in, out)), shape_error,
                         Catch::Matchers::Message("convert_n: input has 5 elements but output has 4"));
    CHECK_THROWS_AS((convert_n<float8_e4m3fn, round_stochastic>(in, out, 1)), shape_error);
    std::vector<float> empty_in;
    std::vector<float8_e4m3fn> empty_out;
    CHECK_NOTHROW(convert_n<float8_e4m3fn>(empty_in, empty_out));
}

TEST_CASE("convert_n encodes, decodes and converts between formats like convert", "[convert_n]")
{
    std::vector<float> in;
    for (int i = -300; i <= 300; ++i) in.push_back(static_cast<float>(i) * 1.37f);
    in.push_back(NAN);
    in.push_back(-INFINITY);
    std::vector<float8_e4m3fn> codes(in.size());
    convert_n<float8_e4m3fn, round_nearest_even, saturate_finite>(std::span<const float>(in), std::span<float8_e4m3fn>(codes));
    std::vector<float> back(in.size());
    convert_n(std::span<const float8_e4m3fn>(codes), std::span<float>(back));
    std::vector<float8_e5m2> other(in.size());
    convert_n<float8_e5m2>(codes, other);
    for (std::size_t i = 0; i < in.size(); ++i) {
        const auto expected = convert<float8_e4m3fn, round_nearest_even, saturate_finite>(in[i]);
        CHECK(codes[i].bits() == expected.bits());
        CHECK((back[i] == static_cast<float>(expected) || (std::isnan(back[i]) && isnan(expected))));
        CHECK(other[i].bits() == float8_e5m2(static_cast<float>(expected)).bits());
    }
    std::vector<double> wide{1.0625 + std::ldexp(1.0, -40)};
    std::vector<float8_e4m3fn> one(1);
    convert_n<float8_e4m3fn>(wide, one);
    CHECK(one[0].bits() == 0x39);  // one rounding from double
}

TEST_CASE("stochastic rounding is unbiased: 42.5 -> e5m2", "[stochastic]")
{
    // 42.5 lies between 40 and 48; it rounds up with probability 2.5 / 8.
    constexpr std::size_t n = 1'000'000;
    const std::vector<float> in(n, 42.5f);
    std::vector<float8_e5m2> out(n);
    convert_n<float8_e5m2, round_stochastic>(in, out, 2024);
    double sum = 0.0;
    for (auto x : out) {
        const float v = static_cast<float>(x);
        REQUIRE((v == 40.0f || v == 48.0f));
        sum += v;
    }
    const double mean = sum / n;
    const double p = 2.5 / 8.0;
    const double sigma = 8.0 * std::sqrt(p * (1 - p) / n);
    CHECK(std::abs(mean - 42.5) < 4 * sigma);
    CHECK(static_cast<float>(float8_e5m2(42.5f)) == 40.0f);  // nearest-even is biased here
}

TEMPLATE_TEST_CASE("stochastic rounding goes up with the distance ratio, normal and subnormal", "[stochastic]",
                   float8_e4m3fn, float8_e5m2, float6_e2m3fn, float4_e2m1fn)
{
    using L = std::numeric_limits<TestType>;
    const float tiny = static_cast<float>(L::denorm_min());
    const float values[] = {1.3f, -2.71828f, static_cast<float>((L::max)()) * 0.9f, tiny * 0.3f, tiny * 2.6f,
                            -static_cast<float>(L::min()) * 0.77f};
    constexpr std::size_t n = 200'000;
    std::uint64_t seed = 7;
    for (float x : values) {
        const float low = static_cast<float>(convert<TestType, round_toward_zero>(x));
        const float high = static_cast<float>(convert<TestType, round_stochastic>(x, 0u));  // zero bits: always up
        REQUIRE(low != high);
        const double p = (static_cast<double>(x) - low) / (static_cast<double>(high) - low);
        const std::vector<float> in(n, x);
        std::vector<TestType> out(n);
        convert_n<TestType, round_stochastic>(in, out, seed++);
        std::size_t up = 0;
        for (auto r : out) {
            const float v = static_cast<float>(r);
            REQUIRE((v == low || v == high));
            up += v == high ? 1 : 0;
        }
        const double frequency = static_cast<double>(up) / n;
        INFO("x = " << x << " between " << low << " and " << high);
        CHECK(std::abs(frequency - p) < 4 * std::sqrt(p * (1 - p) / n));
    }
}

TEST_CASE("stochastic convert_n is reproducible and independent of chunking", "[stochastic]")
{
    std::vector<float> in(10'000);
    std::iota(in.begin(), in.end(), 0.0f);
    for (auto& x : in) x = std::sin(x) * 3.0f;
    std::vector<float8_e4m3fn> whole(in.size()), again(in.size()), chunked(in.size()), other_seed(in.size());
    convert_n<float8_e4m3fn, round_stochastic, saturate_finite>(in, whole, 99);
    convert_n<float8_e4m3fn, round_stochastic, saturate_finite>(in, again, 99);
    convert_n<float8_e4m3fn, round_stochastic, saturate_finite>(in, other_seed, 100);
    const std::span<const float> source(in);
    const std::span<float8_e4m3fn> destination(chunked);
    for (std::size_t begin = 0; begin < in.size(); begin += 997) {
        const std::size_t count = std::min<std::size_t>(997, in.size() - begin);
        convert_n<float8_e4m3fn, round_stochastic, saturate_finite>(source.subspan(begin, count),
                                                                    destination.subspan(begin, count), 99, begin);
    }
    std::size_t differing_seed = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
        CHECK(whole[i].bits() == again[i].bits());
        CHECK(whole[i].bits() == chunked[i].bits());
        differing_seed += whole[i].bits() != other_seed[i].bits() ? 1 : 0;
    }
    CHECK(differing_seed > in.size() / 10);
}

TEST_CASE("stochastic rounding across the 2^32 index boundary", "[stochastic]")
{
    const std::vector<float> in(64, 1.3f);
    std::vector<float8_e4m3fn> whole(64), split(64);
    const std::uint64_t first = (std::uint64_t{1} << 32) - 20;
    convert_n<float8_e4m3fn, round_stochastic>(in, whole, 5, first);
    convert_n<float8_e4m3fn, round_stochastic>(std::span<const float>(in).first(20), std::span(split).first(20), 5, first);
    convert_n<float8_e4m3fn, round_stochastic>(std::span<const float>(in).subspan(20), std::span(split).subspan(20), 5,
                                               first + 20);
    for (std::size_t i = 0; i < 64; ++i) CHECK(whole[i].bits() == split[i].bits());
}

TEMPLATE_TEST_CASE("fake_quantize_n equals encode then decode", "[convert_n]", float8_e4m3fn, float8_e5m2,
                   float8_e4m3fnuz, float8_e5m2fnuz, float8_e4m3b11fnuz, float8_e3m4, float8_e4m3, float6_e2m3fn,
                   float6_e3m2fn, float4_e2m1fn)
{
    // Every code decodes alike through the table and the branch-free path.
    for (unsigned c = 0; c < (1u << TestType::format::total_bits); ++c) {
        const float table = static_cast<float>(TestType::from_bits(static_cast<std::uint8_t>(c)));
        const float computed = detail::decode_branchless<typename TestType::format>(c);
        CHECK((std::bit_cast<std::uint32_t>(table) == std::bit_cast<std::uint32_t>(computed) ||
               (std::isnan(table) && std::isnan(computed))));
    }
    std::vector<float> in{0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1e-30f, -1e30f};
    for (int i = -2000; i <= 2000; ++i) in.push_back(std::ldexp(static_cast<float>(i) * 0.7919f, i % 23));
    std::vector<float> out(in.size());
    fake_quantize_n<TestType, round_nearest_even, saturate_finite>(in, out);
    for (std::size_t i = 0; i < in.size(); ++i) {
        const float expected = static_cast<float>(convert<TestType, round_nearest_even, saturate_finite>(in[i]));
        CHECK((std::bit_cast<std::uint32_t>(out[i]) == std::bit_cast<std::uint32_t>(expected) ||
               (std::isnan(out[i]) && std::isnan(expected))));
    }
}
