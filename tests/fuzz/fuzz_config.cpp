// libFuzzer target: configuration and driving of the stateful components (loss_scaler,
// delayed_scaling, autoscale) from fuzzer-chosen parameters and value sequences. Invalid
// configuration must be a config_error; valid ones must keep their invariants (finite positive
// scale, min_scale floor, bounded history).
#include "fuzz_support.hpp"

#include <scalify/scalify.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace fuzz_config {

using namespace scalify;

namespace {

using fuzz::fail;
using fuzz::reader;

}  // namespace

/// The target's body; fuzz_config's LLVMFuzzerTestOneInput (generated) calls it.
int test_one_input(const std::uint8_t* data, std::size_t size)
{
    reader in{data, size};
    try {
        loss_scaler_config config;
        config.init_scale = in.any_float();
        config.growth_factor = in.any_float();
        config.backoff_factor = in.any_float();
        config.growth_interval = static_cast<int>(static_cast<std::int8_t>(in.byte()));
        config.min_scale = in.byte() % 2 ? in.any_float() : 0.0f;
        loss_scaler scaler(config);
        for (int step = 0; step < 64 && in.size; ++step) {
            std::vector<float> grads{in.any_float()};
            scaler.unscale(std::span<float>(grads));
            scaler.update();
            if (!(scaler.scale() > 0.0f) && !(config.min_scale == 0.0f && scaler.scale() == 0.0f)) fail("loss scale > 0");
            if (!std::isfinite(scaler.scale())) fail("loss scale finite");
            if (scaler.scale() < config.min_scale) fail("min_scale floor");
        }
        loss_scaler other;
        other.restore(scaler.save());
        if (!(other.state() == scaler.state())) fail("save/restore round trip");
    } catch (const config_error&) {
    }
    try {
        delayed_scaling_config config;
        config.amax_history_len = in.byte() % 8;
        config.algo = in.byte() % 2 ? amax_compute_algo::max : amax_compute_algo::most_recent;
        config.margin = static_cast<std::int8_t>(in.byte());
        delayed_scaling<float8_e4m3fn> recipe(config);
        for (int step = 0; step < 32 && in.size; ++step) {
            recipe.record(in.any_float());
            if (!(recipe.multiplier() > 0.0f) || !std::isfinite(recipe.multiplier())) fail("delayed multiplier finite > 0");
            if (recipe.history().size() > config.amax_history_len) fail("history bounded");
        }
    } catch (const config_error&) {
    }
    try {
        // AutoScale: a strategy and a context from fuzzer bytes, then a run of ops (a cast and a
        // matmul per step) over fuzzer-chosen levels, with a final check. Scales stay positive
        // powers of two or the op refuses with a scale_error; nothing else may escape.
        const std::uint8_t which = in.byte() % 3;
        const double op_freq = in.byte() / 200.0;
        const double loop_freq = in.byte() / 200.0;
        autoscale::context_config config;
        config.analysis_iters = in.byte() % 4;
        config.norm = static_cast<autoscale::norm_kind>(in.byte() % 3);
        config.warn_log2 = (static_cast<int>(in.byte()) - 8) / 16.0;
        const auto make = [&]() -> std::unique_ptr<autoscale::scaling_context<pow2_scale>> {
            if (which == 0) return std::make_unique<autoscale::scaling_context<pow2_scale>>(config, autoscale::on_off(op_freq, loop_freq));
            if (which == 1) return std::make_unique<autoscale::scaling_context<pow2_scale>>(config, autoscale::adaptive(op_freq, 1 + in.byte() % 4, 1 + in.byte() % 64));
            return std::make_unique<autoscale::scaling_context<pow2_scale>>(config);
        };
        const auto ctx = make();
        std::size_t warnings = 0;
        ctx->set_warning_handler([&](const autoscale::warning& w) {
            ++warnings;
            if (!(w.held > 0.0f) || !(w.measured > 0.0f)) fail("autoscale warning scales > 0");
        });
        const auto cast_op = ctx->op(in.byte() % 2 ? "a" : "b");
        const auto mm_op = ctx->op("mm");
        for (int step = 0; step < 24 && in.size; ++step) {
            if (step == 20) ctx->final_check();
            const float level = in.any_float();
            const ScaledArray<float, pow2_scale> x(xt::xarray<float>{{level, -level}, {0.5f * level, in.any_float()}}, 1.0f);
            try {
                const auto y = ctx->scale_as<float8_e4m3fn>(cast_op, x);
                if (!is_pow2_or_zero(y.scale())) fail("autoscale cast scale is a power of two");
                const auto z = ctx->apply<float8_e5m2>(mm_op, [&]<class S>(autoscale::strategy_tag<S>) { return matmul<S, float>(y, y); });
                if (!is_pow2_or_zero(z.scale())) fail("autoscale matmul scale is a power of two");
                const auto any = ctx->scale(cast_op, x, dtype::bfloat16);
                if (!(any.scale() >= 0.0f)) fail("autoscale runtime-typed scale >= 0");
            } catch (const scale_error&) {
            }
        }
        const auto report = ctx->report();
        if (report.warnings.size() != warnings) fail("autoscale report keeps every warning");
        std::size_t per_op = 0;
        for (const auto& op : report.ops) {
            per_op += op.warnings;
            if (op.remeasurements + op.analysis_measurements < op.history.size()) fail("autoscale history bounded by measurements");
            if (!(op.prop_scale > 0.0f) || !std::isfinite(op.prop_scale)) fail("autoscale multiplier finite > 0");
        }
        if (per_op != warnings) fail("autoscale per-op warning counts add up");
        (void)fmt::format("{}", report);
    } catch (const config_error&) {
    }
    return 0;
}

}  // namespace fuzz_config
