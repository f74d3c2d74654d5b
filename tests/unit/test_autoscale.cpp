// AutoScale (design "Scale propagation proposal B"): strategies, the scaling context, scale/unscale,
// the scaled Linear with its held multiplier, warnings, the final check and the report.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace scalify;
using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;

namespace {

xt::xarray<float> gaussian(std::vector<std::size_t> shape, float stddev, unsigned seed)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, stddev);
    xt::xarray<float> x = xt::xarray<float>::from_shape(shape);
    for (auto& v : x) v = normal(rng);
    return x;
}

/// Ops with a scalar output whose propagation scale is exactly `level` (RMS of {level, -level}).
template <class Policy>
ScaledArray<float, Policy> constant_op(autoscale::scaling_context<Policy>& ctx, std::string_view name, float level)
{
    const ScaledArray<float, Policy> x(xt::xarray<float>{level, -level}, 1.0f);
    return ctx.template scale_as<float>(ctx.op(name), x);
}

}  // namespace

TEST_CASE("autoscale strategies: conservative, on_off ranking and rounding, adaptive periods", "[autoscale]")
{
    using autoscale::op_summary;
    std::vector<op_summary> ops(3);
    ops[0].name = "scale";
    ops[0].measurements = 6, ops[0].range_log2 = 0.01, ops[0].max_step_log2 = 0.01;
    ops[1].name = "linear";
    ops[1].measurements = 6, ops[1].range_log2 = 0.8, ops[1].max_step_log2 = 0.25;
    ops[2].name = "unscale";
    ops[2].measurements = 6, ops[2].range_log2 = 0.0, ops[2].max_step_log2 = 0.0;

    CHECK(autoscale::conservative{}.schedule(ops) == std::vector<std::size_t>{1, 1, 1});
    // The design's example: 1/3 of the ops (the one whose scale moved most, linear) re-measured
    // every 20 steps, the rest frozen.
    const autoscale::on_off example(1.0 / 3, 1.0 / 20);
    CHECK(example.period() == 20);
    CHECK(example.schedule(ops) == std::vector<std::size_t>{0, 20, 0});
    CHECK(example.ops_on(3) == 1);
    CHECK(example.ops_on(9) == 3);
    CHECK(example.ops_on(8) == 3);  // a share rounds up: conservative
    CHECK(autoscale::on_off(0.0, 1.0).schedule(ops) == std::vector<std::size_t>{0, 0, 0});
    CHECK(autoscale::on_off(1.0, 0.25).schedule(ops) == std::vector<std::size_t>{4, 4, 4});
    CHECK(autoscale::on_off(0.01, 1.0).ops_on(3) == 1);  // any positive share keeps an op on
    CHECK_THAT(example.describe(), Contains("every 20 uses"));

    // adaptive: floor(0.5 / max_step), clamped; unmoved -> max_period; unknown -> min_period.
    const autoscale::adaptive adaptive(0.5, 2, 100);
    CHECK(adaptive.schedule(ops) == std::vector<std::size_t>{50, 2, 100});
    op_summary unknown;
    CHECK(adaptive.period_for(unknown) == 2);

    CHECK_THROWS_AS(autoscale::on_off(1.5, 0.5), config_error);
    CHECK_THROWS_WITH(autoscale::on_off(1.5, 0.5), Contains("op_freq must be in [0, 1], got 1.5"));
    CHECK_THROWS_WITH(autoscale::on_off(0.5, 0.0), Contains("loop_freq must be in (0, 1], got 0"));
    CHECK_THROWS_WITH(autoscale::adaptive(0.0), Contains("tolerance_log2 must be finite and > 0, got 0"));
    CHECK_THROWS_WITH(autoscale::adaptive(1.0, 5, 2), Contains("min_period 5 and max_period 2"));
    CHECK_THROWS_WITH(autoscale::scaling_context<>({.analysis_iters = 0}), Contains("analysis_iters must be > 0, got 0"));
    CHECK_THROWS_WITH(autoscale::scaling_context<>({.warn_log2 = -1.0}), Contains("warn_log2 must be > 0, got -1"));
}

TEST_CASE("on_off follows the design's example: which ops are frozen, which re-measured, when", "[autoscale]")
{
    // scaling_context(analysis_iters=6, rescale_strategy=on_off(op_freq=1/3, loop_freq=1/20)) over three
    // ops: "x" (scale, stable), "linear" (its scale moves during analysis), "w" (stable).
    autoscale::scaling_context<float_scale> ctx({.analysis_iters = 6}, autoscale::on_off(1.0 / 3, 1.0 / 20));
    std::vector<autoscale::warning> warnings;
    ctx.set_warning_handler([&](const autoscale::warning& w) { warnings.push_back(w); });
    for (const char* name : {"x", "linear", "w"}) (void)ctx.op(name);  // registered in this order
    std::vector<std::size_t> measured_at;
    for (std::size_t use = 1; use <= 70; ++use) {
        (void)constant_op(ctx, "x", 3.0f);
        const std::size_t before = ctx.record("linear").history.size();
        (void)constant_op(ctx, "linear", 4.0f * (1.0f + 0.02f * static_cast<float>(use % 3)));
        if (ctx.record("linear").history.size() > before) measured_at.push_back(use);
        (void)constant_op(ctx, "w", 5.0f);
        if (use <= 6) {
            CHECK(ctx.record("x").phase == autoscale::op_phase::analysing);
        }
    }
    // 1/3 of 3 ops: linear stays on, re-measured every 20 uses after the 6 analysis uses; x and w frozen.
    CHECK(ctx.record("linear").phase == autoscale::op_phase::on);
    CHECK(ctx.record("linear").period == 20);
    CHECK(ctx.record("x").phase == autoscale::op_phase::frozen);
    CHECK(ctx.record("w").phase == autoscale::op_phase::frozen);
    CHECK(measured_at == std::vector<std::size_t>{1, 2, 3, 4, 5, 6, 26, 46, 66});
    CHECK(ctx.record("linear").remeasurements == 3);
    CHECK(ctx.record("x").remeasurements == 0);
    CHECK(ctx.record("x").history.size() == 6);  // the analysis only
    CHECK(ctx.record("x").uses == 70);
    CHECK_THAT(ctx.prop_scale("x"), WithinRel(3.0f, 1e-6f));  // frozen at the analysis' geometric mean
    CHECK(warnings.empty());

    // The default is conservative: every op on, re-measured at every use after analysis.
    autoscale::scaling_context<float_scale> all({.analysis_iters = 6});
    for (int use = 1; use <= 10; ++use) {
        (void)constant_op(all, "x", 3.0f);
        (void)constant_op(all, "linear", 4.0f);
    }
    CHECK(all.record("x").phase == autoscale::op_phase::on);
    CHECK(all.record("x").period == 1);
    CHECK(all.record("x").remeasurements == 4);
    CHECK(all.report().remeasurements() == 8);
}

TEST_CASE("the design's contrived example: scale, Linear with its propagation scale, unscale", "[autoscale]")
{
    // x = randn(batch, 16) * 3; linear(16, 10) with weights of std 5; norm = std.
    const std::size_t batch = 4096;
    const xt::xarray<float> x = gaussian({batch, 16}, 3.0f, 1);
    autoscale::scaling_context<float_scale> ctx({.analysis_iters = 6, .norm = autoscale::norm_kind::stddev},
                                                autoscale::on_off(1.0 / 3, 1.0 / 20));
    autoscale::linear<float8_e4m3fn, float_scale> linear(ctx, "linear", gaussian({16, 10}, 5.0f, 2));

    for (int use = 1; use <= 8; ++use) {
        const auto x8 = ctx.scale("x", x, dtype::float8_e4m3fn);
        const auto y = linear(x8);
        const auto z = ctx.unscale(y);
        const bool analysing = use <= 6;
        CHECK(x8.type() == (analysing ? dtype::float32 : dtype::float8_e4m3fn));
        CHECK(y.type() == (analysing ? dtype::float32 : dtype::float8_e4m3fn));
        CHECK(z.type() == dtype::float32);
        CHECK(z.scale() == 1.0f);
        CHECK_THAT(x8.scale(), WithinRel(3.0f, 0.05f));
        const float w_scale = ctx.record(linear.weight_op()).prop_scale;  // a cast of a scale-1 tensor: w.scale
        CHECK_THAT(w_scale, WithinRel(5.0f, 0.3f));
        // y.scale = x.scale * w.scale * prop_scale, prop_scale ~ sqrt(16)
        CHECK_THAT(y.scale(), WithinRel(x8.scale() * w_scale * linear.prop_scale(), 1e-5f));
        CHECK_THAT(linear.prop_scale(), WithinRel(4.0f, 0.3f));
        // z = the float32 value; its std is y.scale (the data have unit std)
        const xt::xarray<float> zv = z.value();
        const double mean = xt::mean(zv)();
        const double sd = std::sqrt(xt::mean(xt::square(zv - mean))());
        CHECK_THAT(sd, WithinRel(double(y.scale()), 0.1));
        // and the value is x @ w: float32 while analysing, to fp8 accuracy after
        const xt::xarray<float> reference =
            matmul<natural_scaling, float>(as_scaled_array(x), as_scaled_array(linear.weight())).value();
        const double error = std::sqrt(xt::mean(xt::square(zv - reference))());
        CHECK(error < (analysing ? 1e-5 : 0.08) * sd);
    }
}

TEST_CASE("after analysis an op runs in its low-precision type with the held multiplier; a re-measurement "
          "is a statistic of that result",
          "[autoscale]")
{
    autoscale::scaling_context<pow2_scale> ctx({.analysis_iters = 3}, autoscale::on_off(1.0, 0.5));
    const auto x = cast<float8_e4m3fn>(make_scaled_array<pow2_scale>(gaussian({64, 16}, 1.0f, 3), 4.0f));
    const auto w = cast<float8_e4m3fn>(make_scaled_array<pow2_scale>(gaussian({16, 16}, 1.0f, 4), 0.5f));
    const auto op = ctx.op("mm");
    int float_runs = 0, held_runs = 0;
    const auto compute = [&]<class S>(autoscale::strategy_tag<S>) {
        (std::same_as<S, natural_scaling> ? float_runs : held_runs)++;
        return matmul<S, float>(x, w);
    };
    for (int use = 1; use <= 3; ++use) (void)ctx.apply<float8_e4m3fn>(op, compute);
    CHECK(float_runs == 3);
    CHECK(held_runs == 0);
    const float prop = ctx.prop_scale("mm");
    CHECK_THAT(prop, WithinRel(4.0f, 0.2f));  // RMS of x.data @ w.data: sqrt(16)
    for (int use = 4; use <= 9; ++use) {
        const auto y = ctx.apply<float8_e4m3fn>(op, compute);
        // the held rule: y.scale = x.scale * w.scale * prop (pow2: rounded to a power of two)
        CHECK(y.scale() == pow2_scale::from_rule(4.0f * 0.5f * prop));
    }
    CHECK(float_runs == 3);  // no float32 re-run: re-measurements (uses 5, 7, 9) used the fp8 statistic
    CHECK(held_runs == 6);
    CHECK(ctx.record("mm").remeasurements == 3);
    CHECK(ctx.record("mm").fallbacks == 0);
    CHECK_THAT(ctx.prop_scale("mm"), WithinRel(prop, 0.05f));
}

TEST_CASE("warnings: a drifting op warns at its re-measurements, a stable one never; the final check "
          "re-measures frozen ops",
          "[autoscale]")
{
    autoscale::scaling_context<pow2_scale> ctx({.analysis_iters = 10, .warn_log2 = 2.0}, autoscale::on_off(0.5, 0.25));
    std::vector<autoscale::warning> warnings;
    ctx.set_warning_handler([&](const autoscale::warning& w) { warnings.push_back(w); });

    // "drifting": moves during analysis (kept on), then grows 2x per use; "stable": constant (frozen).
    for (int use = 1; use <= 30; ++use) {
        const auto s = constant_op(ctx, "stable", 3.0f);
        CHECK_THAT(s.value()(0), WithinRel(3.0f, 0.07f));
        const float level = use <= 10 ? 1.0f + 0.01f * static_cast<float>(use) : std::ldexp(1.1f, use - 10);
        const auto d = constant_op(ctx, "drifting", level);
        CHECK(is_pow2_or_zero(d.scale()));
        // the result is right even where the multiplier is stale: re-measured uses re-store, others saturate
        if ((use - 10) % 4 == 0) CHECK_THAT(d.value()(0), WithinRel(level, 0.07f));
    }
    CHECK(ctx.record("stable").phase == autoscale::op_phase::frozen);
    CHECK(ctx.record("drifting").phase == autoscale::op_phase::on);
    // Re-measured every 4 uses after analysis: 14, 18, 22, 26, 30, each 2^4 (or more) away: a warning each.
    REQUIRE(warnings.size() == 5);
    for (std::size_t i = 0; i < warnings.size(); ++i) {
        CHECK(warnings[i].op == "drifting");
        CHECK(warnings[i].use == 14 + 4 * i);
        CHECK(warnings[i].log2_change() > 2.0);
        CHECK_FALSE(warnings[i].frozen);
    }
    CHECK(ctx.record("drifting").fallbacks == 5);  // the fp8 statistic was off scale: measured in float32

    // The final check re-measures every op, frozen included: stable stays quiet, drifting warns again.
    ctx.final_check();
    (void)constant_op(ctx, "stable", 3.0f);
    (void)constant_op(ctx, "drifting", std::ldexp(1.0f, 40));
    REQUIRE(warnings.size() == 6);
    CHECK(warnings.back().final_check);
    CHECK(warnings.back().op == "drifting");
    CHECK(ctx.record("stable").remeasurements == 1);
    CHECK(ctx.record("stable").history.back().kind == autoscale::event::final_check);

    // A frozen op whose data drift is only caught by the final check.
    autoscale::scaling_context<pow2_scale> frozen({.analysis_iters = 10}, autoscale::on_off(0.0, 1.0));
    std::vector<autoscale::warning> caught;
    frozen.set_warning_handler([&](const autoscale::warning& w) { caught.push_back(w); });
    for (int use = 1; use <= 12; ++use) (void)constant_op(frozen, "op", use <= 10 ? 2.0f : 64.0f);
    CHECK(caught.empty());  // frozen: not re-measured
    frozen.final_check();
    (void)constant_op(frozen, "op", 64.0f);
    REQUIRE(caught.size() == 1);
    CHECK(caught[0].frozen);
    CHECK(caught[0].final_check);
    CHECK(caught[0].log2_change() == 5.0);
    CHECK(frozen.record("op").prop_scale == 2.0f);           // a check only: the multiplier stays
    CHECK(frozen.record("op").history.back().scale == 64.0f);  // and the measurement is in the history
    CHECK_THAT(fmt::format("{}", caught[0]), Contains("op 'op' use 13: propagation scale 2 -> 64 (+5.0 binades, overflow risk) "
                                                    "[frozen op] [final check]"));

    // Conservative: every use re-measured, the multiplier follows slow drift without a warning.
    autoscale::scaling_context<float_scale> conservative({.analysis_iters = 10});
    std::size_t quiet = 0;
    conservative.set_warning_handler([&](const autoscale::warning&) { ++quiet; });
    for (int use = 1; use <= 40; ++use) {
        const auto y = constant_op(conservative, "op", std::ldexp(1.0f, use));
        CHECK_THAT(y.value()(0), WithinRel(std::ldexp(1.0f, use), 1e-6f));
    }
    CHECK(quiet == 0);
}

TEST_CASE("an overflowing low-precision result is caught, re-stored and warned about", "[autoscale]")
{
    autoscale::scaling_context<pow2_scale> ctx({.analysis_iters = 2});
    std::vector<autoscale::warning> warnings;
    ctx.set_warning_handler([&](const autoscale::warning& w) { warnings.push_back(w); });
    const auto op = ctx.op("cast");
    const auto x = [](float level) { return ScaledArray<float, pow2_scale>(xt::xarray<float>{level, -level, 0.5f * level}, 1.0f); };
    for (int use = 1; use <= 2; ++use) (void)ctx.scale_as<float8_e4m3fn>(op, x(1.0f));
    // 2^12 times larger: the held scale would saturate e4m3 (max 448).
    const auto y = ctx.scale_as<float8_e4m3fn>(op, x(4096.0f));
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].saturated);
    CHECK(warnings[0].log2_change() > 11.0);
    CHECK_THAT(y.value()(0), WithinRel(4096.0f, 0.07f));  // this use's result was re-stored
    CHECK(ctx.record("cast").fallbacks == 1);
}

TEST_CASE("any primitive through apply; handles, names and errors", "[autoscale]")
{
    autoscale::scaling_context<pow2_scale> ctx({.analysis_iters = 1});
    const auto x = make_scaled_array<pow2_scale>(xt::xarray<float>{-2.0f, 1.0f, 3.0f, -4.0f}, 2.0f);
    const auto relu_op = ctx.op("relu");
    for (int use = 1; use <= 3; ++use) {
        const auto y = ctx.apply(relu_op, dtype::bfloat16, [&]<class S>(autoscale::strategy_tag<S>) { return relu<S, float>(x); });
        CHECK(y.type() == (use == 1 ? dtype::float32 : dtype::bfloat16));
        const xt::xarray<float> v = y.value();
        CHECK_THAT(v(2), WithinRel(6.0f, 0.01f));
        CHECK(v(0) == 0.0f);
    }
    CHECK(ctx.op("relu").valid());
    CHECK(ctx.size() == 1);
    autoscale::scaling_context<pow2_scale> other;
    CHECK_THROWS_AS(other.record(relu_op), config_error);
    CHECK_THROWS_WITH(ctx.record("nope"), Contains("no op named 'nope'"));
    CHECK_THROWS_AS(ctx.op(""), config_error);
    CHECK_THROWS_AS((autoscale::linear<float8_e4m3fn, pow2_scale>(ctx, "bad", xt::xarray<float>{1.0f, 2.0f})), shape_error);

    // A compute callable that ignores its strategy is refused after analysis.
    const auto rogue = ctx.op("rogue");
    const auto ignore = [&]<class S>(autoscale::strategy_tag<S>) { return relu<natural_scaling, float>(x); };
    (void)ctx.apply<float>(rogue, ignore);
    CHECK_THROWS_WITH(ctx.apply<float>(rogue, ignore), Contains("did not run a scalify primitive with the strategy"));
}

TEST_CASE("report: printable and as CSV, with the scale history", "[autoscale]")
{
    autoscale::scaling_context<float_scale> ctx({.analysis_iters = 2}, autoscale::on_off(0.5, 0.5));
    for (int use = 1; use <= 6; ++use) {
        (void)constant_op(ctx, "a", 2.0f + static_cast<float>(use % 2));
        (void)constant_op(ctx, "b", 8.0f);
    }
    const auto report = ctx.report();
    CHECK(report.op("a").phase == autoscale::op_phase::on);
    CHECK(report.op("b").phase == autoscale::op_phase::frozen);
    CHECK(report.remeasurements() == 2);  // a at uses 4 and 6
    CHECK(report.count(autoscale::op_phase::frozen) == 1);
    const std::string text = fmt::format("{}", report);
    CHECK_THAT(text, Contains("2 ops (1 on, 1 frozen, 0 analysing), 2 re-measurements, 0 warnings"));
    CHECK_THAT(text, Contains("on_off(op_freq=0.5, loop_freq=0.5)"));
    std::ostringstream summary, history;
    report.write_csv(summary);
    CHECK(summary.str() ==
          "op,state,period,uses,analysis_measurements,remeasurements,fallbacks,warnings,prop_scale\n"
          "a,on,2,6,2,2,0,0,2\n"
          "b,frozen,0,6,2,0,0,0,8\n");
    report.write_history_csv(history);
    CHECK(history.str() ==
          "op,state,use,event,prop_scale,warned\n"
          "a,on,1,analysis,3,0\n"
          "a,on,2,analysis,2,0\n"
          "a,on,4,remeasure,2,0\n"
          "a,on,6,remeasure,2,0\n"
          "b,frozen,1,analysis,8,0\n"
          "b,frozen,2,analysis,8,0\n");
    CHECK_THROWS_AS(report.op("zzz"), config_error);
}

TEST_CASE("the final check only looks: a frozen op's drift is reported without moving the ops downstream",
          "[autoscale]")
{
    // "a" casts x (stable during analysis: frozen); "b" is relu of a's result (moves during analysis:
    // on, period 1). After analysis x grows 2^6: a, frozen, passes the growth on in its data.
    autoscale::scaling_context<pow2_scale> ctx({.analysis_iters = 2}, autoscale::on_off(0.5, 1.0));
    std::vector<autoscale::warning> warnings;
    ctx.set_warning_handler([&](const autoscale::warning& w) { warnings.push_back(w); });
    const auto a = ctx.op("a"), b = ctx.op("b");
    const auto step = [&](float level, float wiggle) {
        const ScaledArray<float, pow2_scale> x(xt::xarray<float>{level, -level, wiggle * level, 0.5f * level}, 1.0f);
        const auto x8 = ctx.scale_as<float8_e4m3fn>(a, x);
        return ctx.apply<Eigen::half>(b, [&]<class S>(autoscale::strategy_tag<S>) { return relu<S>(x8); });
    };
    (void)step(1.0f, 1.0f);
    (void)step(1.0f, -1.0f);  // same RMS for a; relu keeps less for b
    CHECK(ctx.record("a").phase == autoscale::op_phase::analysing);
    (void)step(64.0f, 1.0f);  // use 3: the strategy decides; b re-measures and sees a's drift
    CHECK(ctx.record("a").phase == autoscale::op_phase::frozen);
    CHECK(ctx.record("b").phase == autoscale::op_phase::on);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].op == "b");
    CHECK(warnings[0].use == 3);
    (void)step(64.0f, 1.0f);
    CHECK(warnings.size() == 1);  // b now holds the drift
    ctx.final_check();
    const auto y = step(64.0f, 1.0f);
    CHECK_THAT(y.value()(0), WithinRel(64.0f, 0.07f));
    // a reports its drift; b is checked on the same data as before and stays quiet (had a adopted its
    // new multiplier, b would have seen a 2^-6 drop in this very step).
    REQUIRE(warnings.size() == 2);
    CHECK(warnings[1].op == "a");
    CHECK(warnings[1].final_check);
    CHECK(warnings[1].frozen);
    CHECK(ctx.record("b").history.back().kind == autoscale::event::final_check);
}
