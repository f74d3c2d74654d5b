// AutoScale inside autodiff graphs: forward and backward products of a scaled Linear each hold a
// propagation scale; a drop of the loss gradient re-scales only the op whose scale moved.
#include <scalify/scalify.hpp>
#include <scalify/train/autoscale_ad.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace scalify;
using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;

namespace {

using farray = ScaledArray<float, pow2_scale>;

farray gaussian(std::vector<std::size_t> shape, float stddev, unsigned seed)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, stddev);
    xt::xarray<float> x = xt::xarray<float>::from_shape(shape);
    for (auto& v : x) v = normal(rng);
    return farray(std::move(x), 1.0f);
}

template <class A>
struct two_layers {
    A w1, w2;
    template <class F>
    friend void for_each_parameter(two_layers& self, F&& f)
    {
        f(self.w1);
        f(self.w2);
    }
};

double relative_rms(const xt::xarray<float>& a, const xt::xarray<float>& b)
{
    return std::sqrt(xt::mean(xt::square(a - b))() / xt::mean(xt::square(b))());
}

}  // namespace

TEST_CASE("graph_linear: y, grad_x and grad_w are three ops with their own multipliers; gradients match float32",
          "[autoscale][autodiff]")
{
    autoscale::scaling_context<pow2_scale> ctx({.analysis_iters = 3});
    autoscale::graph_linear<float8_e4m3fn, float8_e5m2, float, float8_e5m2, float8_e5m2, pow2_scale> fc1(ctx, "fc1"), fc2(ctx, "fc2");
    const farray x = gaussian({64, 32}, 1.0f, 1);
    const farray target = gaussian({64, 8}, 1.0f, 2);
    const two_layers<farray> params{gaussian({32, 16}, 0.2f, 3), gaussian({16, 8}, 0.3f, 4)};

    const auto scaled = [&](const auto& p) { return reduce_sum(fc2(relu(fc1(x, p.w1)), p.w2) * target); };
    const auto plain = [&](const auto& p) { return reduce_sum(matmul(relu(matmul(x, p.w1)), p.w2) * target); };
    const auto exact = ad::value_and_grad(plain, params);
    // The fp8 baseline: per-tensor current scaling of the same products (E4M3 forward, E5M2 gradients).
    const auto current = [&] {
        ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2, ad::cast_scaling::current);
        return ad::value_and_grad(plain, params);
    }();
    const double loss_error = std::abs(current.value.value()() - exact.value.value()());
    const double w1_error = relative_rms(current.grads.w1.value(), exact.grads.w1.value());
    const double w2_error = relative_rms(current.grads.w2.value(), exact.grads.w2.value());

    for (int step = 1; step <= 6; ++step) {
        INFO("step " << step);
        const auto [loss, grads] = ad::value_and_grad(scaled, params);
        CHECK(grads.w1.type_name() == "float8_e5m2");
        CHECK(grads.w2.type_name() == "float8_e5m2");
        if (step <= 3) {
            // analysis: float32 products, E5M2 gradients
            CHECK_THAT(loss.value()(), WithinRel(exact.value.value()(), 1e-4f));
            CHECK(relative_rms(grads.w1.value(), exact.grads.w1.value()) < 0.1);
            CHECK(relative_rms(grads.w2.value(), exact.grads.w2.value()) < 0.1);
        } else {
            // after: about as accurate as current scaling, with no amax pass, though the weight
            // gradients are stored in E5M2 here (current scaling's stay float32)
            CHECK(std::abs(loss.value()() - exact.value.value()()) < 1.1 * loss_error + 1e-3);
            CHECK(relative_rms(grads.w1.value(), exact.grads.w1.value()) < 1.25 * w1_error);
            CHECK(relative_rms(grads.w2.value(), exact.grads.w2.value()) < 1.25 * w2_error);
        }
    }
    // Every product is an op of its own; fc1's input gradient is never needed (x is a constant).
    // fc2.grad_x leaves in E5M2, but relu's rule between the layers computes in float32 and returns
    // float32 (docs/ops.md, "Arithmetic: which type each step runs in"), so fc1.g casts again.
    for (const char* name : {"fc1.x", "fc1.w", "fc1.y", "fc1.g", "fc1.grad_w", "fc2.x", "fc2.w", "fc2.y", "fc2.g",
                             "fc2.grad_x", "fc2.grad_w"}) {
        INFO(name);
        CHECK(ctx.record(name).uses == 6);
        CHECK(ctx.record(name).analysis_measurements == 3);
        CHECK(ctx.record(name).remeasurements == 3);  // conservative: every use after analysis
    }
    CHECK(ctx.record("fc1.grad_x").uses == 0);
    CHECK(ctx.warnings().empty());
    // The three multipliers of fc2 are measured separately: y ~ sqrt(16) (unit operands), the
    // gradients from their own products.
    CHECK(fc2.prop_scale() != fc2.grad_x_prop_scale());
    CHECK(fc2.prop_scale() != fc2.grad_w_prop_scale());
    CHECK_THAT(fc2.prop_scale(), WithinRel(4.0f, 0.35f));

    // Without a tape: the forward ops only.
    const auto y = fc1(x, params.w1);
    CHECK(y.shape()[1] == 16);
    CHECK(ctx.record("fc1.grad_w").uses == 6);
    CHECK_THROWS_AS(fc1(x, params.w2), shape_error);
}

TEST_CASE("drift: multiplying the loss by 2^-10 midway warns at the ops whose scale moved, and only there",
          "[autoscale][autodiff][drift]")
{
    const farray x = gaussian({128, 32}, 1.0f, 5);
    const farray target = gaussian({128, 8}, 1.0f, 6);
    const farray weak_target(target.data() * std::ldexp(1.0f, -10), 1.0f);  // 2^-10 in the data
    const two_layers<farray> start{gaussian({32, 32}, 0.2f, 7), gaussian({32, 8}, 0.2f, 8)};

    struct outcome {
        std::vector<autoscale::warning> warnings;
        autoscale::scaling_report report;
        std::vector<float> fc1_grad_w_amax;  // what a TransformerEngine amax history would see
    };
    // 60 steps of SGD; from step 31 the loss is 2^-10 times smaller, through its data or its scale.
    const auto run = [&](bool through_data) {
        autoscale::scaling_context<pow2_scale> ctx({.analysis_iters = 5});
        outcome out;
        ctx.set_warning_handler([&](const autoscale::warning& w) { out.warnings.push_back(w); });
        autoscale::graph_linear<float8_e4m3fn, float8_e5m2, float, float8_e5m2, float8_e5m2, pow2_scale> fc1(ctx, "fc1"), fc2(ctx, "fc2");
        two_layers<farray> params = start;
        const auto sgd_step = [](farray& w, const ad::gradient<pow2_scale>& g) {
            w = farray(w.value() - 1e-3f * g.value(), 1.0f);
        };
        for (int step = 1; step <= 60; ++step) {
            const bool late = step > 30;
            const auto loss = [&](const auto& p) {
                const auto y = fc2(relu(fc1(x, p.w1)), p.w2);
                if (!late) return reduce_sum(y * target);
                if (through_data) return reduce_sum(y * weak_target);
                return reduce_sum(y * target) * std::ldexp(1.0, -10);
            };
            const auto [value, grads] = ad::value_and_grad(loss, params);
            out.fc1_grad_w_amax.push_back(xt::amax(xt::abs(grads.w1.value()))());
            sgd_step(params.w1, grads.w1);
            sgd_step(params.w2, grads.w2);
        }
        ctx.final_check();
        (void)ad::value_and_grad([&](const auto& p) { return reduce_sum(fc2(relu(fc1(x, p.w1)), p.w2) * (through_data ? weak_target : target)); },
                                 params);
        out.report = ctx.report();
        return out;
    };

    // Through the data: the loss gradient's data drop 2^10 where they enter the scaled graph, the cast
    // of fc2's cotangent (fc2.g). It warns at step 31, and nothing else does: fc2.grad_x, fc2.grad_w
    // and fc1.grad_w see the drop in their input scales, their multipliers do not move (yet fc1's
    // weight gradient fell 2^10: a TransformerEngine amax history would move for every one of them).
    const outcome data = run(true);
    REQUIRE(data.warnings.size() == 1);
    CHECK(data.warnings[0].op == "fc2.g");
    CHECK(data.warnings[0].use == 31);
    CHECK_THAT(data.warnings[0].log2_change(), WithinRel(-10.0, 0.05));
    CHECK_FALSE(data.warnings[0].final_check);
    for (const char* name : {"fc2.grad_x", "fc2.grad_w", "fc1.grad_w"}) {
        INFO(name);
        CHECK(data.report.op(name).fallbacks == 0);
        CHECK(data.report.op(name).remeasurements == 55 + 1);  // conservative, and the final check
    }
    CHECK(data.fc1_grad_w_amax[30] < data.fc1_grad_w_amax[29] * std::ldexp(1.0f, -9));
    for (const auto& op : data.report.ops) {
        INFO(op.name);
        CHECK(op.warnings == (op.name == "fc2.g" ? 1u : 0u));
    }
    CHECK_THAT(fmt::format("{}", data.report), Contains("1 warnings"));

    // Through the scale (a loss weight): no multiplier moves, no warning anywhere.
    const outcome scale = run(false);
    CHECK(scale.warnings.empty());
    CHECK(scale.fc1_grad_w_amax[30] < scale.fc1_grad_w_amax[29] * std::ldexp(1.0f, -9));
}

namespace {

/// A model written once: plain ScaledArrays, vars of any strategy, autoscaled vars.
template <class Params, class X>
auto forward(const Params& p, const X& x)
{
    return matmul(relu(matmul(x, p.w1)), p.w2);
}

}  // namespace

TEST_CASE("a model written once runs its matmuls under a context through the autoscaled strategy", "[autoscale][autodiff]")
{
    using S = autoscale::autoscaled<unit_scaling>;
    autoscale::scaling_context<pow2_scale> ctx({.analysis_iters = 2}, autoscale::on_off(1.0 / 3, 1.0 / 4));
    const farray x = gaussian({32, 16}, 1.0f, 9);
    const farray target = gaussian({32, 4}, 1.0f, 10);
    const two_layers<farray> params{gaussian({16, 8}, 0.25f, 11), gaussian({8, 4}, 0.35f, 12)};
    const auto loss = [&](const auto& p) { return reduce_sum(forward(p, x) * target); };
    const auto exact = ad::value_and_grad<unit_scaling>(loss, params);
    for (int step = 1; step <= 10; ++step) {
        const autoscale::graph_scope step_scope(ctx);
        const auto [value, grads] = ad::value_and_grad<S>(loss, params);
        CHECK(relative_rms(grads.w1.value(), exact.grads.w1.value()) < 0.25);
        CHECK(relative_rms(grads.w2.value(), exact.grads.w2.value()) < 0.25);
    }
    // Two matmuls per step: layers matmul1 and matmul2, named in call order.
    CHECK(ctx.record("matmul1.y").uses == 10);
    CHECK(ctx.record("matmul2.grad_x").uses == 10);
    CHECK(ctx.record("matmul2.g").uses == 10);
    // on_off(1/3, 1/4) over the 11 ops used: 4 on (re-measured at uses 6 and 10), 7 frozen;
    // matmul1.grad_x (x is a constant) never runs. matmul1.g does: the default layer keeps grad_x
    // in float32, so the cotangent reaching matmul1 is cast to E5M2 there.
    const auto report = ctx.report();
    CHECK(report.count(autoscale::op_phase::on) == 4);
    CHECK(report.count(autoscale::op_phase::frozen) == 7);
    CHECK(report.count(autoscale::op_phase::analysing) == 1);
    CHECK(report.op("matmul1.grad_x").uses == 0);
    CHECK(report.op("matmul1.g").uses == 10);
    CHECK(report.remeasurements() == 8);

    // Evaluation: inference uses are not counted and not measured.
    {
        const autoscale::graph_scope eval(ctx, /*inference*/ true);
        using constant = ad::var<float, pow2_scale, S>;
        const auto y = forward(two_layers<constant>{params.w1, params.w2}, constant(x)).value();
        const xt::xarray<float> reference = forward(params, x).value();
        CHECK(relative_rms(xt::xarray<float>(y.value()), reference) < 0.1);
    }
    CHECK_FALSE(ctx.inference());
    CHECK(ctx.record("matmul1.y").uses == 10);
    CHECK(ctx.report().remeasurements() == 8);

    // Outside a scope an autoscaled matmul has no context.
    using constant = ad::var<float, pow2_scale, S>;
    CHECK_THROWS_WITH(matmul(constant(x), constant(params.w1)), Contains("outside an autoscale::graph_scope"));
}

TEST_CASE("runtime_scaling lists the autoscaled strategy: its matmuls run as layers only while it is the choice",
          "[autoscale][autodiff]")
{
    using S = autoscale::autoscaled<unit_scaling>;
    using rules = runtime_scaling<natural_scaling, S>;
    const farray x = gaussian({32, 16}, 1.0f, 9);
    const farray target = gaussian({32, 4}, 1.0f, 10);
    const two_layers<farray> params{gaussian({16, 8}, 0.25f, 11), gaussian({8, 4}, 0.35f, 12)};
    const auto loss = [&](const auto& p) { return reduce_sum(forward(p, x) * target); };
    const auto same_bits = [](const auto& a, const auto& b) {
        return a.scale() == b.scale() && xt::xarray<float>(a.value()) == xt::xarray<float>(b.value());
    };

    // Chosen: the steps of the strategy named directly, bit for bit, each with a context of its own.
    autoscale::scaling_context<pow2_scale> direct({.analysis_iters = 2}, autoscale::on_off(1.0 / 3, 1.0 / 4));
    autoscale::scaling_context<pow2_scale> listed({.analysis_iters = 2}, autoscale::on_off(1.0 / 3, 1.0 / 4));
    for (int step = 1; step <= 6; ++step) {
        INFO("step " << step);
        const auto expected = [&] {
            const autoscale::graph_scope scope(direct);
            return ad::value_and_grad<S>(loss, params);
        }();
        const rules::scope chosen(rules::index_of<S>);
        const autoscale::graph_scope scope(listed);
        const auto got = ad::value_and_grad<rules>(loss, params);
        CHECK(same_bits(got.value, expected.value));
        CHECK(same_bits(got.grads.w1, expected.grads.w1));
        CHECK(same_bits(got.grads.w2, expected.grads.w2));
    }
    CHECK(listed.record("matmul2.grad_w").uses == 6);
    CHECK(listed.report().remeasurements() == direct.report().remeasurements());

    // Not chosen: the list's matmuls, no layer and no scope needed.
    const auto expected = ad::value_and_grad<natural_scaling>(loss, params);
    const auto got = ad::value_and_grad<rules>(loss, params);
    CHECK(same_bits(got.value, expected.value));
    CHECK(same_bits(got.grads.w1, expected.grads.w1));
    CHECK(same_bits(got.grads.w2, expected.grads.w2));
    CHECK(listed.record("matmul2.grad_w").uses == 6);
}
