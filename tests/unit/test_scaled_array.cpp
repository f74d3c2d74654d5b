// ScaledArray: construction, scale validation, value(), policies.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

using namespace scalify;
using Catch::Matchers::Contains;

TEST_CASE("ScaledArray holds data and scale; value is data * scale", "[scaled_array]")
{
    const xt::xarray<float8_e4m3fn> data{float8_e4m3fn(1.0f), float8_e4m3fn(-2.0f), float8_e4m3fn(448.0f)};
    const ScaledArray<float8_e4m3fn, pow2_scale> a = make_scaled_array<pow2_scale>(data, 0.25f);
    CHECK(a.scale() == 0.25f);
    CHECK(a.shape().size() == 1);
    CHECK(a.size() == 3);
    const xt::xarray<float> v = a.value();
    CHECK(v(0) == 0.25f);
    CHECK(v(1) == -0.5f);
    CHECK(v(2) == 112.0f);
    CHECK(a.data()(2).bits() == 0x7e);

    const auto x = as_scaled_array(xt::xarray<float>{{1, 2}, {3, 4}});
    CHECK(x.scale() == 1.0f);
    CHECK(x.dimension() == 2);
    static_assert(std::same_as<decltype(x), const ScaledArray<float, float_scale>>);
}

TEST_CASE("bad scales are scale_errors that name the value", "[scaled_array][errors]")
{
    const xt::xarray<float> data{1.0f, 2.0f};
    CHECK_THROWS_MATCHES(make_scaled_array(data, -1.0f), scale_error, Catch::Matchers::Message("ScaledArray: scale must be finite and >= 0, got -1"));
    CHECK_THROWS_WITH(make_scaled_array(data, std::numeric_limits<float>::quiet_NaN()), Contains("got nan"));
    CHECK_THROWS_WITH(make_scaled_array(data, std::numeric_limits<float>::infinity()), Contains("got inf"));
    CHECK_THROWS_WITH(make_scaled_array<pow2_scale>(data, 3.0f), Contains("pow2_scale needs 0 or a power of two, got 3"));
    CHECK_NOTHROW(make_scaled_array<pow2_scale>(data, 0.0f));
    CHECK_NOTHROW(make_scaled_array<pow2_scale>(data, std::ldexp(1.0f, -140)));  // subnormal power of two
    CHECK_NOTHROW(make_scaled_array<pow2_scale>(data, std::ldexp(1.0f, 127)));
    CHECK(std::signbit(make_scaled_array(data, -0.0f).scale()) == false);
}

TEST_CASE("a zero scale is a zero array whatever the data", "[scaled_array]")
{
    const auto a = make_scaled_array(xt::xarray<float>{std::numeric_limits<float>::quiet_NaN(),
                                                       std::numeric_limits<float>::infinity(), 5.0f},
                                     0.0f);
    const xt::xarray<float> v = a.value();
    for (float x : v) CHECK(x == 0.0f);
}

TEST_CASE("pow2 rounding helpers", "[scaled_array]")
{
    CHECK(pow2_round_down(3.0f) == 2.0f);
    CHECK(pow2_round_up(3.0f) == 4.0f);
    CHECK(pow2_round_up(4.0f) == 4.0f);
    CHECK(pow2_round_nearest(1.41f) == 1.0f);
    CHECK(pow2_round_nearest(1.42f) == 2.0f);
    CHECK(pow2_round_nearest(std::ldexp(1.5f, -130)) == std::ldexp(2.0f, -130));
    CHECK(is_pow2_or_zero(0.0f));
    CHECK(is_pow2_or_zero(std::ldexp(1.0f, -149)));
    CHECK_FALSE(is_pow2_or_zero(0.75f));
    CHECK_FALSE(is_pow2_or_zero(-2.0f));
    CHECK(pow2_scale::from_rule(22.6f) == 16.0f);  // sqrt(512): nearest in log2
    CHECK(float_scale::from_rule(22.6f) == 22.6f);
}

TEST_CASE("policies convert where the scale allows", "[scaled_array]")
{
    const auto a = make_scaled_array(xt::xarray<float>{1.0f}, 0.5f);
    CHECK(a.with_policy<pow2_scale>().scale() == 0.5f);
    CHECK_THROWS_AS(make_scaled_array(xt::xarray<float>{1.0f}, 0.3f).with_policy<pow2_scale>(), scale_error);
}

TEST_CASE("every element type: float, double, minifloats, half, bfloat16", "[scaled_array]")
{
    const auto check = [](auto one) {
        using T = decltype(one);
        const auto a = make_scaled_array(xt::xarray<T>{one, one}, 2.0f);
        CHECK(a.value()(1) == 2.0);
    };
    check(1.0f);
    check(1.0);
    check(float8_e5m2(1.0f));
    check(float6_e2m3fn(1.0f));
    check(float4_e2m1fn(1.0f));
    check(Eigen::half(1.0f));
    check(Eigen::bfloat16(1.0f));
}
