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

using namespace scalify;

namespace {

using fuzz::fail;
using fuzz::reader;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
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
        autoscale_config config;
        config.analysis_iters = in.byte() % 4;
        config.op_freq = in.byte() / 200.0;
        config.loop_freq = in.byte() / 200.0;
        config.warn_log2 = in.byte() / 16.0;
        autoscale<pow2_scale> scaler(config);
        scaler.set_warning_handler([](const autoscale_warning&) {});
        for (int step = 0; step < 16 && in.size; ++step) {
            const float level = in.any_float();
            const auto y = scaler.run<float8_e4m3fn>(in.byte() % 2 ? "a" : "b", std::abs(in.any_float()),
                                                     [level] { return xt::xarray<float>{level, -level}; });
            if (!is_pow2_or_zero(y.scale()) || !(y.scale() > 0.0f)) fail("autoscale scale is a positive power of two");
        }
    } catch (const config_error&) {
    }
    return 0;
}
