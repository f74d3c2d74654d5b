// Mixed precision: op classes per policy, user overrides, the autocast scope and wrappers, and
// the decoupled exp.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <stdexcept>

using namespace scalify;

namespace {

// A user override: gelu in float32 under half_policy only.
struct gelu_in_float_policy : half_policy {};

// A whole user policy: bfloat16, and add denied too.
struct strict_policy {
    using low_precision = Eigen::bfloat16;
    template <class Op>
    using rule = precision_rule<std::same_as<Op, ops::add> ? precision_class::deny : default_precision_class<Op>, Eigen::bfloat16>;
};

struct model_dtypes {
    dtype matmul, add, relu, softmax, sum, reshape;
};

/// The same model code under any policy: returns the dtype each op produced.
template <class Policy>
model_dtypes run_model(const any_scaled_array<>& x, const any_scaled_array<>& w, const any_scaled_array<>& bias)
{
    using A = amp<Policy>;
    const auto h = A::matmul(x, w);
    const auto z = A::add(h, bias);
    const auto r = A::relu(z);
    const auto p = A::softmax(r, 1);
    const auto s = A::reduce_sum(p, {1});
    const auto q = A::reshape(r, {r.value().size()});
    return {h.type(), z.type(), r.type(), p.type(), s.type(), q.type()};
}

any_scaled_array<> random_input(std::vector<std::size_t> shape, unsigned seed)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    xt::xarray<float> x = xt::xarray<float>::from_shape(shape);
    for (auto& e : x) e = normal(rng);
    return as_scaled_array(x);
}

}  // namespace

template <>
struct scalify::op_precision<scalify::ops::gelu, gelu_in_float_policy>
    : scalify::precision_rule<scalify::precision_class::deny, Eigen::half> {};

TEST_CASE("op classes: default table", "[amp]")
{
    STATIC_REQUIRE(op_precision<ops::matmul, half_policy>::value == precision_class::allow);
    STATIC_REQUIRE(op_precision<ops::add, half_policy>::value == precision_class::follow);
    STATIC_REQUIRE(op_precision<ops::relu, fp8_policy>::value == precision_class::follow);
    STATIC_REQUIRE(op_precision<ops::exp, half_policy>::value == precision_class::deny);
    STATIC_REQUIRE(op_precision<ops::softmax, half_policy>::value == precision_class::deny);
    STATIC_REQUIRE(op_precision<ops::reduce_sum, half_policy>::value == precision_class::deny);
    STATIC_REQUIRE(std::same_as<op_precision<ops::matmul, fp8_policy>::output, float8_e4m3fn>);
    STATIC_REQUIRE(std::same_as<op_precision<ops::exp, fp8_policy>::output, float>);
    STATIC_REQUIRE(std::same_as<op_precision<ops::matmul, half_policy>::accumulate, float>);
    STATIC_REQUIRE(AmpPolicy<strict_policy>);
    STATIC_REQUIRE(!AmpPolicy<int>);
}

TEST_CASE("the same model under two policies yields the documented dtypes", "[amp]")
{
    const auto x = random_input({4, 8}, 1), w = random_input({8, 6}, 2), b = random_input({6}, 3);
    const autocast on;
    const auto half = run_model<half_policy>(x, w, b);
    CHECK(half.matmul == dtype::float16);  // allow
    CHECK(half.add == dtype::float32);     // follow: the bias is float32, so the add runs in float32
    CHECK(half.relu == dtype::float32);    // follow: its input is float32 now
    CHECK(half.softmax == dtype::float32); // deny
    CHECK(half.sum == dtype::float32);     // deny
    CHECK(half.reshape == dtype::float32);

    const any_scaled_array<> b8 = cast<float8_e4m3fn>(as_scaled_array(xt::xarray<float>{0.5f, -1, 2, 0, 1, 3}));
    const auto fp8 = run_model<fp8_policy>(x, w, b8);
    CHECK(fp8.matmul == dtype::float8_e4m3fn);
    CHECK(fp8.add == dtype::float8_e4m3fn);  // follow: both inputs fp8
    CHECK(fp8.relu == dtype::float8_e4m3fn);
    CHECK(fp8.reshape == dtype::float8_e4m3fn);
    CHECK(fp8.softmax == dtype::float32);
    CHECK(fp8.sum == dtype::float32);

    const auto strict = run_model<strict_policy>(x, w, cast<Eigen::bfloat16>(b.as<float>()));
    CHECK(strict.matmul == dtype::bfloat16);
    CHECK(strict.add == dtype::float32);  // the whole-policy override denies add
}

TEST_CASE("every amp op follows its class", "[amp]")
{
    const autocast on;
    using A = amp<half_policy>;
    const any_scaled_array<> h = cast<Eigen::half>(as_scaled_array(xt::xarray<float>{{1.0f, 4.0f}, {9.0f, 16.0f}}));
    const any_scaled_array<> f = as_scaled_array(xt::xarray<float>{{1.0f, 2.0f}, {3.0f, 4.0f}});
    for (const auto& r : {A::sub(h, h), A::div(h, h), A::maximum(h, h), A::minimum(h, h), A::neg(h), A::abs(h), A::transpose(h)}) {
        CHECK(r.type() == dtype::float16);  // follow, all inputs fp16
    }
    for (const auto& r : {A::sub(h, f), A::maximum(f, h), A::neg(f)}) CHECK(r.type() == dtype::float32);  // follow, a float32 input
    for (const auto& r : {A::sqrt(h), A::reduce_max(h, {1}), A::exp(h), A::log(h)}) CHECK(r.type() == dtype::float32);  // deny
    CHECK(A::sqrt(h).value()(1, 1) == 4.0f);
    CHECK(A::transpose(h).value()(0, 1) == 9.0f);
}

TEST_CASE("a user specialisation overrides one op", "[amp]")
{
    const autocast on;
    const any_scaled_array<> h = cast<Eigen::half>(as_scaled_array(xt::xarray<float>{-1.0f, 0.5f, 2.0f}));
    CHECK(amp<half_policy>::gelu(h).type() == dtype::float16);
    CHECK(amp<gelu_in_float_policy>::gelu(h).type() == dtype::float32);
    CHECK(amp<gelu_in_float_policy>::relu(h).type() == dtype::float16);  // other ops unchanged
}

TEST_CASE("autocast scopes nest, restore, and survive exceptions", "[amp][autocast]")
{
    const auto x = random_input({2, 3}, 4), w = random_input({3, 2}, 5);
    CHECK_FALSE(autocast_enabled());
    CHECK(amp<half_policy>::matmul(x, w).type() == dtype::float32);  // off: float32
    {
        const autocast on;
        CHECK(autocast_enabled());
        CHECK(amp<half_policy>::matmul(x, w).type() == dtype::float16);
        {
            const autocast off(false);
            CHECK_FALSE(autocast_enabled());
            CHECK(amp<half_policy>::matmul(x, w).type() == dtype::float32);
            {
                const autocast again;
                CHECK(autocast_enabled());
            }
            CHECK_FALSE(autocast_enabled());
        }
        CHECK(autocast_enabled());
        try {
            const autocast off(false);
            throw std::runtime_error("inside");
        } catch (const std::runtime_error&) {
        }
        CHECK(autocast_enabled());
    }
    CHECK_FALSE(autocast_enabled());
}

TEST_CASE("autocast_fn and float32_fn cast at the region's boundary", "[amp][autocast]")
{
    const auto x = random_input({2, 3}, 6), w = random_input({3, 2}, 7);
    const auto low_region = autocast_fn([](const any_scaled_array<>& a, const any_scaled_array<>& b) {
        const auto y = amp<half_policy>::matmul(a, b);
        CHECK(y.type() == dtype::float16);  // low precision inside
        return y;
    });
    CHECK(low_region(x, w).type() == dtype::float32);  // but not outside
    CHECK_FALSE(autocast_enabled());

    const autocast on;
    const any_scaled_array<> h = cast<Eigen::half>(x.as<float>());
    const auto island = float32_fn([](const any_scaled_array<>& a) {
        CHECK_FALSE(autocast_enabled());
        CHECK(a.type() == dtype::float32);  // inputs arrive as float32
        return amp<half_policy>::relu(a);
    });
    CHECK(island(h).type() == dtype::float32);
    CHECK(autocast_enabled());
    // Plain ScaledArrays cross the boundary as float data too.
    const auto typed = float32_fn([](const auto& a) { return a; })(cast<Eigen::half>(x.as<float>()));
    STATIC_REQUIRE(std::same_as<std::decay_t<decltype(typed)>, ScaledArray<float, float_scale>>);
}

TEST_CASE("decoupled exp picks fp16 for small inputs and float32 for large ones", "[amp][decoupling]")
{
    decoupling_counts() = {};
    std::mt19937 rng(8);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    xt::xarray<float> x = xt::xarray<float>::from_shape({64});
    for (auto& e : x) e = uniform(rng);
    const auto check = [&](float scale, bool expect_fp16) {
        const auto a = cast<Eigen::half>(make_scaled_array<pow2_scale>(x, scale));
        const auto before = decoupling_counts();
        const auto y = decoupled_exp(a);
        CHECK(decoupling_counts().low_precision == before.low_precision + (expect_fp16 ? 1 : 0));
        CHECK(decoupling_counts().float32 == before.float32 + (expect_fp16 ? 0 : 1));
        const xt::xarray<float> v = a.value();
        const xt::xarray<float> got = y.value();
        for (std::size_t i = 0; i < v.size(); ++i) {
            const double reference = std::exp(static_cast<double>(v(i)));
            // One fp16 rounding (2^-11 relative) plus float32 arithmetic; below fp16's smallest
            // subnormal times the scale, values flush (one scale cannot span e^-64..e^64).
            CHECK(std::abs(got(i) - reference) <= (std::ldexp(1.0, -11) + 1e-6) * reference + std::ldexp(1.0, -25) * y.scale());
        }
        return y;
    };
    const auto small = check(4.0f, true);      // |x| <= 4: e^4 fits fp16
    CHECK(small.scale() == 1.0f);
    const auto large = check(64.0f, false);    // |x| up to 64: e^64 does not
    CHECK(large.scale() > 1.0f);
    CHECK(decoupling_counts().low_precision == 1);
    CHECK(decoupling_counts().float32 == 1);
}
