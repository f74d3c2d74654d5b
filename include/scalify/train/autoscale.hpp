#pragma once
/// \file autoscale.hpp
/// AutoScale (design: "Scale propagation proposal B"). Every scaled op holds a *propagation scale*,
/// a multiplier on its natural scale (the product of its input scales for a matmul, the input scale
/// for a cast, ...): the result is stored with
///
///     y.scale = natural * prop_scale          y.data = raw / prop_scale
///
/// (for a matmul `y.scale = x.scale * w.scale * prop_scale`, `y.data = x.data @ w.data / prop_scale`),
/// so a scale change anywhere upstream flows through an op whose own multiplier stays put.
///
/// 1. Analysis: an op's first `analysis_iters` uses run in float32; each measures the propagation
///    scale as norm(raw) (RMS, standard deviation or amax of x.data @ w.data, say) and collects its
///    statistics. While analysing, the runtime-typed API returns float32 data.
/// 2. When an op that finished its analysis is used again, the rescale strategy (autoscale_strategy.hpp)
///    gives every op that finished its analysis a period: re-measured every `period` uses, or frozen
///    (period 0, held at the geometric mean of its analysis measurements).
/// 3. After analysis the op runs in its low-precision type with the held multiplier, saturating.
///    A re-measurement costs a statistic of that low-precision result: prop *= norm(y.data)
///    (the data should have norm 1). Only when the statistic cannot be trusted (|log2 norm| beyond
///    warn_log2, saturated or non-finite values, all zeros) does the op run once more in float32 to
///    measure exactly, and that use's result is re-stored under the corrected scale.
/// 4. A re-measurement that moves the multiplier by more than warn_log2 binades, or that finds saturated
///    or non-finite values, raises an over/underflow warning (handler; default: one line on stderr).
/// 5. final_check(): the next use of every op, frozen ones included, re-measures and compares. It
///    only looks: the ops keep their multipliers and results (unless a result saturated), so no
///    correction upstream moves the data an op downstream is checked on.
/// 6. report(): per op its state (analysing / on / frozen), period, re-measurement count and scale
///    history; printable with fmt and written as CSV.
///
///     autoscale::scaling_context<float_scale> ctx({.analysis_iters = 6, .norm = autoscale::norm_kind::stddev},
///                                                 autoscale::on_off(1.0 / 3, 1.0 / 20));
///     autoscale::linear<float8_e4m3fn, float_scale> fc(ctx, "fc", w);     // holds its prop_scale
///     auto x8 = ctx.scale("x", x, dtype::float8_e4m3fn);                 // float32 while analysing
///     auto y = fc(x8);                                                     // y.scale = x.scale * w.scale * prop
///     xt::xarray<float> z = ctx.unscale(y).value();
///
/// Any primitive runs under the context through apply(), which hands the primitive the strategy to use:
///
///     auto h = ctx.apply<float8_e4m3fn>(ctx.op("act"), [&]<class S>(autoscale::strategy_tag<S>) {
///         return gelu<S, float>(y8);
///     });
///
/// Inside autodiff graphs (forward and backward ops each with a multiplier): autoscale_ad.hpp.
///
/// The parts: autoscale/report.hpp (vocabulary, warnings, report), autoscale/held_scaling.hpp (the
/// strategy each op runs under), autoscale/statistics.hpp (what is measured), autoscale/context.hpp
/// (scaling_context), autoscale/linear.hpp (a scaled layer); autoscale_strategy.hpp (rescale
/// strategies) and autoscale_ad.hpp (inside autodiff graphs).

#include <scalify/train/autoscale/context.hpp>
#include <scalify/train/autoscale/held_scaling.hpp>
#include <scalify/train/autoscale/linear.hpp>
#include <scalify/train/autoscale/report.hpp>
#include <scalify/train/autoscale/statistics.hpp>
#include <scalify/train/autoscale_strategy.hpp>
