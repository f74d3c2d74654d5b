// Scaling over time: loss scaling (GradScaler semantics), current and delayed amax scaling.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

using namespace scalify;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

TEST_CASE("loss_scaler defaults and formulas", "[loss_scaler]")
{
    loss_scaler scaler;
    CHECK(scaler.scale() == 65536.0f);
    CHECK(scaler.config().growth_factor == 2.0f);
    CHECK(scaler.config().backoff_factor == 0.5f);
    CHECK(scaler.config().growth_interval == 2000);
    CHECK(scaler.scale(0.5f) == 32768.0f);

    // A ScaledArray loss is scaled through its scale; the data are untouched.
    const auto loss = make_scaled_array<pow2_scale>(xt::xarray<Eigen::half>{Eigen::half(0.75f)}, 1.0f);
    const auto scaled = scaler.scale(loss);
    CHECK(scaled.scale() == 65536.0f);
    CHECK(static_cast<float>(scaled.data()(0)) == 0.75f);

    // unscale divides the scale, reports inf/NaN, and update backs off / grows.
    std::vector<ScaledArray<Eigen::half, pow2_scale>> grads{
        make_scaled_array<pow2_scale>(xt::xarray<Eigen::half>{Eigen::half(3.0f)}, 4.0f)};
    CHECK_FALSE(scaler.unscale(grads));
    CHECK(grads[0].scale() == 4.0f / 65536.0f);
    CHECK(static_cast<float>(grads[0].data()(0)) == 3.0f);
    scaler.update();
    CHECK(scaler.state().growth_tracker == 1);

    std::vector<ScaledArray<Eigen::half, pow2_scale>> bad{
        make_scaled_array<pow2_scale>(xt::xarray<Eigen::half>{std::numeric_limits<Eigen::half>::infinity()}, 1.0f)};
    CHECK(scaler.unscale(bad));
    CHECK_FALSE(scaler.should_step());
    scaler.update();
    CHECK(scaler.scale() == 32768.0f);
    CHECK(scaler.state().growth_tracker == 0);

    // Zero-scale gradients are zeros, never inf.
    std::vector<ScaledArray<float, float_scale>> zero{make_scaled_array(xt::xarray<float>{std::nanf("")}, 0.0f)};
    CHECK_FALSE(scaler.unscale(zero));

    std::vector<float> plain{1.0f, std::numeric_limits<float>::quiet_NaN()};
    CHECK(scaler.unscale(std::span<float>(plain)));
    CHECK(plain[0] == 1.0f / 32768.0f);
}

TEST_CASE("loss_scaler grows after the interval and respects min_scale", "[loss_scaler]")
{
    loss_scaler scaler({.init_scale = 8.0f, .growth_factor = 4.0f, .backoff_factor = 0.25f, .growth_interval = 3, .min_scale = 1.0f});
    std::vector<float> grads{1.0f};
    for (int step = 1; step <= 3; ++step) {
        scaler.unscale(std::span<float>(grads));
        scaler.update();
    }
    CHECK(scaler.scale() == 32.0f);
    std::vector<float> inf{std::numeric_limits<float>::infinity()};
    for (int i = 0; i < 5; ++i) {
        scaler.unscale(std::span<float>(inf));
        scaler.update();
    }
    CHECK(scaler.scale() == 1.0f);  // 32 -> 8 -> 2 -> floor 1

    // Checkpoint round trip, exact.
    loss_scaler other;
    other.restore(scaler.save());
    CHECK(other.state() == scaler.state());
    CHECK(scaler.save() == "scale=0x1p+0 growth_tracker=0");
    CHECK_THROWS_AS(other.restore("nonsense"), config_error);
}

TEST_CASE("loss_scaler rejects bad configuration, naming the parameter", "[loss_scaler][errors]")
{
    CHECK_THROWS_MATCHES(loss_scaler({.growth_factor = 1.0f}), config_error,
                         Catch::Matchers::Message("loss_scaler: growth_factor must be finite and > 1, got 1"));
    CHECK_THROWS_WITH(loss_scaler({.backoff_factor = 1.0f}), Contains("backoff_factor must be in (0, 1), got 1"));
    CHECK_THROWS_WITH(loss_scaler({.growth_interval = 0}), Contains("growth_interval must be > 0, got 0"));
    CHECK_THROWS_WITH(loss_scaler({.init_scale = -2.0f}), Contains("init_scale"));
    CHECK_THROWS_WITH(loss_scaler({.min_scale = -1.0f}), Contains("min_scale"));
    // fuzz_config: an initial scale below the floor would start under it.
    CHECK_THROWS_WITH(loss_scaler({.init_scale = 1.0f, .min_scale = 4.0f}), Contains("init_scale must be >= min_scale (4), got 1"));
}

TEST_CASE("loss scaling keeps shrinking gradients inside fp16", "[loss_scaler]")
{
    // Gradients halve every step, from 2^-10: without scaling fp16 flushes them below 2^-24.
    loss_scaler scaler({.init_scale = 1.0f, .growth_factor = 2.0f, .backoff_factor = 0.5f, .growth_interval = 1});
    int unscaled_zero_at = -1;
    for (int step = 0; step < 40; ++step) {
        const float g = std::ldexp(1.0f, -10 - step);
        if (unscaled_zero_at < 0 && static_cast<float>(Eigen::half(g)) == 0.0f) unscaled_zero_at = step;
        // The backward pass computes the scaled gradient in fp16.
        const Eigen::half scaled_grad(g * scaler.scale());
        std::vector<float> grads{static_cast<float>(scaled_grad)};
        scaler.unscale(std::span<float>(grads));
        CHECK(grads[0] == g);  // exact: the scaled value is a normal fp16 number
        scaler.update();
    }
    CHECK(unscaled_zero_at == 15);  // 2^-25 rounds to 0 in fp16
}

TEST_CASE("current_scaling: tensorwise multiplier", "[amax_scaling]")
{
    const current_scaling<float8_e4m3fn> recipe;
    CHECK(recipe.multiplier(2.0f) == 224.0f);
    CHECK(recipe.multiplier(0.0f) == 1.0f);  // no finite non-zero element: scale 1, as quantize<T>
    CHECK(recipe.multiplier(std::numeric_limits<float>::infinity()) == 1.0f);
    CHECK(recipe.multiplier(1e-30f) == 448.0f / 1e-30f);  // exact down to where q leaves float32
    const current_scaling<float8_e4m3fn> pow2{.power_of_two = true};
    CHECK(pow2.multiplier(2.0f) == 128.0f);

    const xt::xarray<float> x{0.5f, -2.0f, 1.0f};
    const auto q = recipe.quantize(x);
    CHECK(q.scale() == 1.0f / 224.0f);
    CHECK(static_cast<float>(q.data()(1)) == -448.0f);
    CHECK(q.value()(0) == Approx(0.5f).epsilon(0.07));
    const auto q2 = recipe.quantize<pow2_scale>(x);
    CHECK(q2.scale() == 1.0f / 128.0f);
}

TEST_CASE("delayed_scaling follows the amax history with one step of lag", "[amax_scaling]")
{
    delayed_scaling<float8_e4m3fn> recipe({.amax_history_len = 4, .algo = amax_compute_algo::max, .margin = 1});
    CHECK(recipe.multiplier() == 1.0f);
    // amax halves every step; max over the last 4 lags behind.
    for (int step = 0; step < 8; ++step) {
        const float amax = std::ldexp(1.0f, 4 - step);
        const float expected_q_before = recipe.multiplier();
        const auto q = recipe.quantize(xt::xarray<float>{amax, -amax / 2});
        CHECK(q.scale() == 1.0f / expected_q_before);
        const float history_max = std::ldexp(1.0f, 4 - std::max(0, step - 3));
        CHECK(recipe.multiplier() == Approx(448.0f / 2 / history_max));
    }
    CHECK(recipe.history().size() == 4);
    // 0, inf and NaN amax keep the multiplier.
    delayed_scaling<float8_e5m2> recent({.amax_history_len = 1, .algo = amax_compute_algo::most_recent});
    recent.record(2.0f);
    CHECK(recent.multiplier() == 57344.0f / 2.0f);
    recent.record(0.0f);
    recent.record(std::numeric_limits<float>::infinity());
    recent.record(std::numeric_limits<float>::quiet_NaN());
    CHECK(recent.multiplier() == 57344.0f / 2.0f);

    CHECK_THROWS_MATCHES(delayed_scaling<float8_e4m3fn>({.amax_history_len = 0}), config_error,
                         Catch::Matchers::Message("delayed_scaling: amax_history_len must be > 0, got 0"));
    CHECK_THROWS_WITH(delayed_scaling<float8_e4m3fn>({.margin = -1}), Contains("margin must be >= 0, got -1"));
    static_assert(std::same_as<hybrid_recipe::forward, float8_e4m3fn>);
    static_assert(std::same_as<hybrid_recipe::backward, float8_e5m2>);
}

TEST_CASE("dynamic_rescale_max / l1 / l2 move the magnitude into the scale", "[rescale]")
{
    const auto a = make_scaled_array(xt::xarray<float>{0.0f, 24.0f, -8.0f, 8.0f}, 0.5f);
    const auto m = dynamic_rescale_max(a);
    CHECK(m.scale() == 16.0f);  // max 24 -> nearest power of two 32? log2 midpoint of 16 and 32 is 22.6: 32
    CHECK((m.value() == a.value()));
    const auto l1 = dynamic_rescale_l1(a);  // mean |.| = 10 -> 8
    CHECK(l1.scale() == 4.0f);
    const auto l2 = dynamic_rescale_l2(a);  // RMS = sqrt(176) = 13.3 -> 16
    CHECK(l2.scale() == 8.0f);
    CHECK((l2.value() == a.value()));
    // pow2 policy stays valid; zero data and zero scale are left alone; epsilon floors tiny data.
    const auto p = make_scaled_array<pow2_scale>(xt::xarray<float>{3.0f}, 2.0f);
    CHECK(is_pow2_or_zero(dynamic_rescale_max(p).scale()));
    const auto zeros = make_scaled_array(xt::xarray<float>{0.0f, 0.0f}, 2.0f);
    CHECK(dynamic_rescale_l2(zeros).scale() == 2.0f);
    const auto tiny = make_scaled_array(xt::xarray<float>{1e-20f}, 1.0f);
    CHECK(dynamic_rescale_max(tiny, 1e-3f).scale() == pow2_round_nearest(1e-3f));
}

TEST_CASE("tensor_stats judge values against a target format", "[diagnostics]")
{
    const auto a = make_scaled_array(xt::xarray<float>{0.0f, 1.0f, -500.0f, 0.001f, 1e-4f, std::nanf("")}, 1.0f);
    const auto s = tensor_stats<float8_e4m3fn>(a, "a");
    CHECK(s.count == 6);
    CHECK(s.zeros == 1);
    CHECK(s.non_finite == 1);
    CHECK(s.amax == 500.0);
    CHECK(s.min_nonzero == Approx(1e-4));
    CHECK(s.saturate_fraction == Approx(1.0 / 6));
    CHECK(s.underflow_fraction == Approx(1.0 / 4));   // 1e-4 < 2^-10 (half of e4m3fn's 2^-9)
    CHECK(s.subnormal_fraction == Approx(1.0 / 4));   // 0.001 is in [2^-10, 2^-6)
    CHECK(s.exponent_histogram.at(8) == 1);           // 500
    const std::string text = fmt::format("{}", s);
    CHECK_THAT(text, Contains("a: 6 elements as float8_e4m3fn: amax 500"));
    CHECK_THAT(fmt::format("{}", tensor_stats<float4_e2m1fn>(a)), StartsWith("6 elements as float4_e2m1fn: "));
    // A target chosen at run time: the same result as naming its type.
    for (const dtype target : {dtype::float32, dtype::float16, dtype::bfloat16, dtype::float8_e4m3fn, dtype::float8_e5m2}) {
        INFO(to_string(target));
        visit_dtype(target, [&]<class T>() { CHECK(fmt::format("{}", tensor_stats(a, target, "a")) == fmt::format("{}", tensor_stats<T>(a, "a"))); });
    }
    CHECK(format_range_of(dtype::float8_e4m3fn).max == 448.0);
    CHECK(format_range_of(dtype::float8_e5m2).zero_threshold == 0x1p-17);
    // element_name spells every format as ml_dtypes does.
    CHECK(element_name<float8_e5m2> == "float8_e5m2");
    CHECK(element_name<float8_e4m3fnuz> == "float8_e4m3fnuz");
    CHECK(element_name<float8_e5m2fnuz> == "float8_e5m2fnuz");
    CHECK(element_name<float8_e4m3b11fnuz> == "float8_e4m3b11fnuz");
    CHECK(element_name<float8_e3m4> == "float8_e3m4");
    CHECK(element_name<float8_e4m3> == "float8_e4m3");
    CHECK(element_name<float8_e8m0fnu> == "float8_e8m0fnu");
    CHECK(element_name<float6_e2m3fn> == "float6_e2m3fn");
    CHECK(element_name<float6_e3m2fn> == "float6_e3m2fn");
    CHECK(element_name<Eigen::bfloat16> == "bfloat16");
    CHECK(element_name<double> == "float64");
    CHECK_THAT(text, Contains("saturate 16.67%"));

    scale_tracker tracker;
    tracker.record(0, "fc1", a);
    tracker.record(1, "fc1", mul(a, 2.0));
    std::ostringstream csv;
    tracker.write_csv(csv);
    CHECK(csv.str() == "step,op,scale,data_amax\n0,fc1,1,500\n1,fc1,2,500\n");
}

// AutoScale: tests/unit/test_autoscale.cpp.

TEST_CASE("fuzz regressions: delayed_scaling never stores a zero or infinite multiplier", "[amax_scaling][fuzz_regression]")
{
    // fuzz_config found a large margin whose multiplier underflowed float to 0.
    delayed_scaling<float8_e4m3fn> recipe({.amax_history_len = 2, .margin = 127});
    recipe.record(1e30f);
    CHECK(recipe.multiplier() == 1.0f);
    recipe.record(1e-30f);
    CHECK(recipe.multiplier() > 0.0f);
    CHECK(std::isfinite(recipe.multiplier()));
}
