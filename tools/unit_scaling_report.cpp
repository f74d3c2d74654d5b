// Measures the data RMS of every op's output and gradient under unit_scaling for unit-normal
// inputs, and of 16-layer relu / gelu MLPs and an e4m3fn residual stream layer by layer: after
// the current rules, before them (scalify's earlier unit_scaling), and, for the ops, what
// Graphcore unit-scaling's rules give the same inputs. Writes, into OUT_DIR:
//   unit_scaling_ops.md      the per-op table (docs/ops.md shows it)
//   unit_scaling_chains.md   the chains' extremes over K = 256, 1024, 4096
//   unit_scaling_chains.dat  per-layer forward data RMS, for tools/unit_scaling_chains.gp
//   unit_scaling_grads.dat   per-layer weight-gradient data RMS
// cmake -P cmake/unit_scaling_report.cmake builds and runs it, draws the figure and splices the
// tables into docs/ops.md.
//
//   unit_scaling_report OUT_DIR
#include "../tests/support/unit_weights.hpp"

#include <scalify/scalify.hpp>

#include <fmt/format.h>
#include <fmt/os.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace scalify;

namespace {

using array = ScaledArray<float, float_scale>;
constexpr double no_rule = std::numeric_limits<double>::quiet_NaN();

// ---- the "before" rules ----------------------------------------------------------------------

/// The earlier pow2 rounding: the float sqrt(2) * 2^k compared against the exact midpoint,
/// so that tie rounded down.
float previous_pow2_nearest(float s)
{
    const float down = pow2_round_down(s);
    return static_cast<double>(s) >= static_cast<double>(down) * 1.4142135623730951 ? 2.0f * down : down;
}

/// scalify's earlier unit_scaling: sqrt(sa^2 + sb^2) for add/sub, the seed's rules for
/// every other op (natural scale, sqrt(K) for matmul and sums), pow2 ties rounded down.
struct unit_scaling_before {
    static constexpr bool needs_amax = false;
    template <ScalePolicy Policy, class Op>
    [[nodiscard]] static float output_scale(Op op, const scale_request& request) noexcept
    {
        if constexpr (std::same_as<Op, ops::add> || std::same_as<Op, ops::sub>) {
            const double a = request.input_scales[0], b = request.input_scales[1];
            const auto s = static_cast<float>(std::sqrt(a * a + b * b));
            return Policy::power_of_two && s > 0.0f ? previous_pow2_nearest(s) : s;
        } else {
            const float s = default_scaling::output_scale<float_scale>(op, request);
            return Policy::power_of_two && s > 0.0f && std::isfinite(s) ? previous_pow2_nearest(s) : s;
        }
    }
};

/// softmax_vjp as it was composed before: mul, reduce_sum, sub and mul, each with its own rule.
template <class S>
array softmax_vjp_before(const array& g, const array& y, std::size_t axis)
{
    const auto gy = mul<S, float>(g, y);
    const auto dot = reduce_sum_vjp(reduce_sum<S, float>(gy, {axis}), gy.shape(), {axis});
    return mul<S, float>(y, sub<S, float>(g, dot));
}

// ---- measurements ----------------------------------------------------------------------------

array unit_normal(std::mt19937& rng, std::vector<std::size_t> shape, float scale = 1.0f)
{
    std::normal_distribution<float> normal;
    xt::xarray<float> data = xt::xarray<float>::from_shape(shape);
    for (auto& x : data) x = normal(rng);
    return array(std::move(data), scale);
}

array log_normal(std::mt19937& rng, std::vector<std::size_t> shape)
{
    xt::xarray<float> data = unit_normal(rng, std::move(shape)).data();
    for (auto& x : data) x = std::exp(x);
    return array(std::move(data), 1.0f);
}

template <class T, class P>
double data_rms(const ScaledArray<T, P>& a)
{
    double sum = 0.0;
    std::size_t finite = 0;
    for (const auto& x : a.data()) {
        const double v = static_cast<double>(detail::load(x));
        if (!std::isfinite(v)) return std::numeric_limits<double>::quiet_NaN();
        sum += v * v;
        ++finite;
    }
    return finite ? std::sqrt(sum / static_cast<double>(finite)) : 0.0;
}

template <class T, class P>
double value_rms(const ScaledArray<T, P>& a)
{
    const auto v = a.value();
    double sum = 0.0;
    for (const auto x : v) sum += double(x) * double(x);
    return v.size() ? std::sqrt(sum / static_cast<double>(v.size())) : 0.0;
}

struct op_row {
    std::string op, inputs;
    double before, after;
    double graphcore;  ///< data RMS under Graphcore unit-scaling's rule (NaN: it has none)
    std::string graphcore_rule;
};

/// One row: `run<S>()` is the op under strategy S; Graphcore's data are the value times its
/// multiplier (its tensors are the values; it assumes unit-scale inputs, as these are).
template <class Run, class RunBefore>
op_row measure(std::string op, std::string inputs, Run run, RunBefore run_before, double graphcore_multiplier,
               std::string graphcore_rule)
{
    const auto after = run();
    const double graphcore = std::isnan(graphcore_multiplier) ? no_rule : value_rms(after) * graphcore_multiplier;
    return {std::move(op), std::move(inputs), data_rms(run_before()), data_rms(after), graphcore, std::move(graphcore_rule)};
}

#define BOTH(expression_of_S)                                                                        \
    [&] {                                                                                            \
        using S [[maybe_unused]] = unit_scaling;                                                     \
        return expression_of_S;                                                                      \
    },                                                                                               \
        [&] {                                                                                        \
            using S [[maybe_unused]] = unit_scaling_before;                                          \
            return expression_of_S;                                                                  \
        }

std::vector<op_row> op_table()
{
    std::mt19937 rng(2024);
    std::vector<op_row> rows;
    const std::size_t batch = 64, k = 1024, n = 256;
    const auto x = unit_normal(rng, {batch, k});
    const auto w = unit_normal(rng, {k, n});  // unit values, as Graphcore's weights
    const auto gy = unit_normal(rng, {batch, n});
    const auto g = unit_normal(rng, {batch, k});
    const auto row = unit_normal(rng, {k});
    const auto c = make_scaled_array(xt::xarray<float>{3.0f}, 1.0f);
    const auto positive = log_normal(rng, {batch, k});
    const double inv_sqrt_k = 1.0 / std::sqrt(double(k)), sqrt1_2 = std::sqrt(0.5);
    const std::string unit = "N(0,1) 64x1024";

    rows.push_back(measure("matmul", "x 64x1024, w 1024x256", BOTH((matmul<S>(x, w))), inv_sqrt_k, "x K^-1/2"));
    rows.push_back(measure("matmul_vjp (x)", "g 64x256", BOTH((matmul_vjp<S>(gy, x, w).first)), inv_sqrt_k,
                           "x K^-1/2 (to_output_scale; N^-1/2 unconstrained)"));
    rows.push_back(measure("matmul_vjp (w)", "g 64x256", BOTH((matmul_vjp<S>(gy, x, w).second)), inv_sqrt_k,
                           "x K^-1/2 (to_output_scale; M^-1/2 unconstrained)"));
    rows.push_back(measure("add", unit + " + same", BOTH((add<S>(x, g))), sqrt1_2, "x 2^-1/2"));
    rows.push_back(measure("add, broadcast", unit + " + 1024", BOTH((add<S>(x, row))), sqrt1_2, "x 2^-1/2"));
    rows.push_back(measure("add, one element", unit + " + [3]", BOTH((add<S>(x, c))), 1.0, "none (a constant)"));
    rows.push_back(measure("add_vjp (broadcast operand)", "g " + unit, BOTH((add_vjp<S>(g, x.shape(), row.shape()).second)),
                           sqrt1_2, "x 2^-1/2 (to_output_scale; 64^-1/2 unconstrained)"));
    rows.push_back(measure("mul", unit + " * same", BOTH((mul<S>(x, g))), 1.0, "none"));
    rows.push_back(measure("mul, one element", unit + " * [3]", BOTH((mul<S>(x, c))), 1.0, "none"));
    rows.push_back(measure("mul_vjp (broadcast operand)", "g " + unit, BOTH((mul_vjp<S>(g, x, row).second)), 1.0, "none"));
    rows.push_back(measure("relu", unit, BOTH((relu<S>(x))), 1.0, "none"));
    rows.push_back(measure("relu_vjp", "g, x " + unit, BOTH((relu_vjp<S>(g, x))), 1.0, "none"));
    rows.push_back(measure("gelu", unit, BOTH((gelu<S>(x))), 1.767, "x 1.767"));
    rows.push_back(measure("gelu_vjp", "g, x " + unit, BOTH((gelu_vjp<S>(g, x))), 1.767, "x 1.767 (to_output_scale; 1.516 unconstrained)"));
    rows.push_back(measure("tanh", unit, BOTH((tanh<S>(x))), 1.0, "none"));
    rows.push_back(measure("tanh_vjp", "g, x " + unit, BOTH((tanh_vjp<S>(g, x))), 1.0, "none"));
    rows.push_back(measure("exp", unit, BOTH((exp<S>(x))), 1.0, "none"));
    rows.push_back(measure("exp_vjp", "g " + unit + ", y = exp(x)", BOTH((exp_vjp<S>(g, exp<S>(x)))), 1.0, "none"));
    rows.push_back(measure("log", "e^N(0,1) 64x1024", BOTH((log<S>(positive))), 1.0, "none"));
    rows.push_back(measure("log_vjp", "g, x = e^N(0,1)", BOTH((log_vjp<S>(g, positive))), 1.0, "none"));
    rows.push_back(measure("sqrt", "e^N(0,1) 64x1024", BOTH((sqrt<S>(positive))), 1.0, "none"));
    rows.push_back(measure("sqrt_vjp", "g, y = sqrt(e^N(0,1))", BOTH((sqrt_vjp<S>(g, sqrt<S>(positive)))), 1.0, "none"));
    rows.push_back(measure("reduce_sum", unit + ", axis 0", BOTH((reduce_sum<S>(x, {0}))), 1.0, "none"));
    rows.push_back(measure("reduce_mean", unit + ", axis 0", BOTH((reduce_mean<S>(x, {0}))), 1.0, "none"));
    const auto g_columns = unit_normal(rng, {k});
    rows.push_back(measure("reduce_sum_vjp", "g 1024", BOTH((reduce_sum_vjp(g_columns, x.shape(), {0}))), 1.0, "none"));
    rows.push_back(measure("reduce_mean_vjp", "g 1024", BOTH((reduce_mean_vjp<S>(g_columns, x.shape(), {0}))), 1.0, "none"));
    const auto p1 = unit_normal(rng, {batch, 100}), p2 = unit_normal(rng, {batch, 30}, 16.0f), p3 = unit_normal(rng, {batch, 126}, 0.25f);
    rows.push_back(measure("concatenate", "scales 1, 16, 1/4", BOTH((concatenate<S>({p1, p2, p3}, 1))), 1.0, "none"));
    for (const std::size_t length : {8u, 1024u, 65536u}) {
        const std::size_t lanes = std::max<std::size_t>(8, std::min<std::size_t>(512, (std::size_t{1} << 17) / length));
        const auto logits = unit_normal(rng, {lanes, length});
        const auto gl = unit_normal(rng, {lanes, length});
        const std::string at = fmt::format("N(0,1) {}x{}", lanes, length);
        const double l09 = std::pow(double(length), 0.9);
        rows.push_back(measure(fmt::format("softmax, L = {}", length), at, BOTH((softmax<S>(logits, 1))), l09, "x L^0.9"));
        rows.push_back(measure(fmt::format("softmax_vjp, L = {}", length), "g " + at,
                               [&] { return softmax_vjp<unit_scaling>(gl, softmax<unit_scaling>(logits, 1), 1); },
                               [&] { return softmax_vjp_before<unit_scaling_before>(gl, softmax<unit_scaling_before>(logits, 1), 1); },
                               l09, "x L^0.9 (to_output_scale)"));
        rows.push_back(measure(fmt::format("log_softmax, L = {}", length), at, BOTH((log_softmax<S>(logits, 1))), 1.0, "none"));
        rows.push_back(measure(fmt::format("log_softmax_vjp, L = {}", length), "g " + at,
                               BOTH((log_softmax_vjp<S>(gl, log_softmax<S>(logits, 1), 1))), 1.0, "none"));
    }
    for (const auto& [classes, lanes] : {std::pair<std::size_t, std::size_t>{12, 512}, {3000, 64}, {100000, 8}}) {
        const auto logits = unit_normal(rng, {lanes, classes});
        std::vector<std::int32_t> labels(lanes);
        for (auto& label : labels) label = static_cast<std::int32_t>(rng() % classes);
        const double c_rule = double(classes) / std::sqrt(double(classes) - 1.0);
        // Graphcore's gradient leaves out the mean's 1/batch (its loss is a sum scaled forward only).
        rows.push_back(measure(fmt::format("cross-entropy gradient, C = {}", classes), fmt::format("N(0,1) {}x{}", lanes, classes),
                               BOTH((softmax_cross_entropy<S>(logits, labels).grad)), c_rule * double(lanes),
                               "x C/sqrt(C-1), without 1/B"));
    }
    return rows;
}

// ---- chains ----------------------------------------------------------------------------------

/// Layer `layer`'s k x k unit-variance weights at scale 1/sqrt(k) (tests/support/unit_weights.hpp).
array layer_weights(std::size_t layer, std::size_t k)
{
    return testing::unit_weights<float_scale>(7000 + layer, k, k);
}

struct chain {
    std::vector<double> forward, weight_gradient;
};

/// 16 layers x <- act(x W) and back, weights regenerated in the backward pass.
template <class S, class Act, class ActVjp>
chain mlp(std::size_t k, std::size_t batch, Act act, ActVjp act_vjp)
{
    constexpr std::size_t depth = 16;
    std::mt19937 rng(static_cast<std::uint32_t>(k));
    chain out;
    std::vector<array> inputs{unit_normal(rng, {batch, k})}, pre;
    for (std::size_t l = 0; l < depth; ++l) {
        pre.push_back(matmul<S>(inputs.back(), layer_weights(l, k)));
        inputs.push_back(act(pre.back()));
        out.forward.push_back(data_rms(inputs.back()));
    }
    array g = unit_normal(rng, {batch, k});
    out.weight_gradient.resize(depth);
    for (std::size_t l = depth; l-- > 0;) {
        auto [gx, gw] = matmul_vjp<S>(act_vjp(g, pre[l]), inputs[l], layer_weights(l, k));
        out.weight_gradient[l] = data_rms(gw);
        g = std::move(gx);
    }
    return out;
}

template <class S>
chain relu_mlp(std::size_t k, std::size_t batch)
{
    return mlp<S>(k, batch, [](const array& h) { return relu<S>(h); }, [](const array& g, const array& h) { return relu_vjp<S>(g, h); });
}
template <class S>
chain gelu_mlp(std::size_t k, std::size_t batch)
{
    return mlp<S>(k, batch, [](const array& h) { return gelu<S>(h); }, [](const array& g, const array& h) { return gelu_vjp<S>(g, h); });
}

/// x <- x + x W in e4m3fn, 16 layers; `after_add` is the pow2 recipe's step (or nothing).
template <class S, class P, class AfterAdd>
std::vector<double> residual(AfterAdd after_add)
{
    constexpr std::size_t k = 256, batch = 64;
    std::mt19937 rng(24);
    const auto to_fp8 = [](const array& a) { return cast<float8_e4m3fn>(a.with_policy<P>()); };
    auto x = to_fp8(unit_normal(rng, {batch, k}));
    std::vector<double> rms;
    for (std::size_t l = 0; l < 16; ++l) {
        x = after_add(add<S>(x, matmul<S>(x, to_fp8(layer_weights(l, k)))));
        rms.push_back(data_rms(x));
    }
    return rms;
}

std::string number(double v)
{
    if (std::isnan(v)) return "NaN";
    if (v != 0.0 && (std::abs(v) < 0.01 || std::abs(v) >= 1000.0)) return fmt::format("{:.1e}", v);
    return fmt::format("{:.3g}", v);
}

std::pair<double, double> extremes(const std::vector<double>& v)
{
    double lo = std::numeric_limits<double>::infinity(), hi = 0.0;
    for (double x : v) {
        if (std::isnan(x)) return {x, x};
        lo = std::min(lo, x);
        hi = std::max(hi, x);
    }
    return {lo, hi};
}

}  // namespace

int main(int argc, char** argv)
{
    if (argc != 2) {
        fmt::print(stderr, "usage: unit_scaling_report OUT_DIR\n");
        return 2;
    }
    const std::string dir = argv[1];

    {
        auto md = fmt::output_file(dir + "/unit_scaling_ops.md");
        md.print("| op | inputs | data RMS before | data RMS now | Graphcore unit-scaling: rule | its data RMS |\n");
        md.print("|---|---|---|---|---|---|\n");
        for (const auto& r : op_table()) {
            md.print("| {} | {} | {} | **{}** | {} | {} |\n", r.op, r.inputs, number(r.before), number(r.after), r.graphcore_rule,
                     std::isnan(r.graphcore) ? "-" : number(r.graphcore));
        }
    }

    // Per-layer series at K = 1024 for the figure; extremes over K for the table.
    const auto relu_before = relu_mlp<unit_scaling_before>(1024, 64), relu_after = relu_mlp<unit_scaling>(1024, 64);
    const auto gelu_before = gelu_mlp<unit_scaling_before>(1024, 64), gelu_after = gelu_mlp<unit_scaling>(1024, 64);
    const auto nothing = [](auto x) { return x; };
    const auto residual_before = residual<unit_scaling_before, pow2_scale>(nothing);
    const auto residual_float = residual<unit_scaling, float_scale>(nothing);
    const auto residual_pow2_bare = residual<unit_scaling, pow2_scale>(nothing);
    const auto residual_pow2 = residual<unit_scaling, pow2_scale>([](auto x) { return dynamic_rescale_l2(x); });
    {
        auto dat = fmt::output_file(dir + "/unit_scaling_chains.dat");
        dat.print("# layer relu_before relu_after gelu_before gelu_after residual_before residual_float residual_pow2_bare residual_pow2_recipe\n");
        for (std::size_t l = 0; l < 16; ++l) {
            // A layer holding NaN/inf is written as NaN: gnuplot leaves the point out.
            dat.print("{} {} {} {} {} {} {} {} {}\n", l + 1, number(relu_before.forward[l]), number(relu_after.forward[l]),
                      number(gelu_before.forward[l]), number(gelu_after.forward[l]), number(residual_before[l]),
                      number(residual_float[l]), number(residual_pow2_bare[l]), number(residual_pow2[l]));
        }
        auto grads = fmt::output_file(dir + "/unit_scaling_grads.dat");
        grads.print("# layer relu_before relu_after gelu_before gelu_after (weight gradients)\n");
        for (std::size_t l = 0; l < 16; ++l) {
            grads.print("{} {} {} {} {}\n", l + 1, number(relu_before.weight_gradient[l]), number(relu_after.weight_gradient[l]),
                        number(gelu_before.weight_gradient[l]), number(gelu_after.weight_gradient[l]));
        }
    }
    {
        auto md = fmt::output_file(dir + "/unit_scaling_chains.md");
        md.print("| 16-layer chain | K | batch | forward data RMS, min - max | weight-gradient data RMS, min - max | before: forward, weight gradient |\n");
        md.print("|---|---|---|---|---|---|\n");
        const auto line = [&](const char* name, std::size_t k, std::size_t batch, const chain& after, const chain& before) {
            const auto [f_lo, f_hi] = extremes(after.forward);
            const auto [w_lo, w_hi] = extremes(after.weight_gradient);
            md.print("| {} | {} | {} | **{} - {}** | **{} - {}** | {} - {}, {} - {} |\n", name, k, batch, number(f_lo), number(f_hi),
                     number(w_lo), number(w_hi), number(extremes(before.forward).first), number(extremes(before.forward).second),
                     number(extremes(before.weight_gradient).first), number(extremes(before.weight_gradient).second));
        };
        for (const auto& [k, batch] : {std::pair<std::size_t, std::size_t>{256, 64}, {1024, 64}, {4096, 16}}) {
            const bool figure_size = k == 1024;
            line("relu MLP", k, batch, figure_size ? relu_after : relu_mlp<unit_scaling>(k, batch),
                 figure_size ? relu_before : relu_mlp<unit_scaling_before>(k, batch));
            line("gelu MLP", k, batch, figure_size ? gelu_after : gelu_mlp<unit_scaling>(k, batch),
                 figure_size ? gelu_before : gelu_mlp<unit_scaling_before>(k, batch));
        }
        const auto stream = [&](const char* name, const std::vector<double>& rms) {
            std::size_t finite_layers = 0;
            while (finite_layers < rms.size() && !std::isnan(rms[finite_layers])) ++finite_layers;
            const auto [lo, hi] = extremes(std::vector<double>(rms.begin(), rms.begin() + static_cast<std::ptrdiff_t>(finite_layers)));
            const std::string nan_note = finite_layers < rms.size() ? fmt::format(", then NaN/inf from layer {}", finite_layers + 1) : "";
            md.print("| {} | 256 | 64 | **{} - {}**{} | | |\n", name, number(lo), number(hi), nan_note);
        };
        stream("e4m3fn residual stream, float scales", residual_float);
        stream("e4m3fn residual stream, pow2 + dynamic_rescale_l2 per layer", residual_pow2);
        stream("e4m3fn residual stream, pow2 alone (ties up)", residual_pow2_bare);
        stream("e4m3fn residual stream, before (pow2, ties down)", residual_before);

        // fp8 casts: the share of the non-zero float results that the cast flushes to zero.
        const auto lost = [](const auto& cast_result, const array& reference) {
            std::size_t flushed = 0, nonzero = 0;
            for (std::size_t i = 0; i < reference.size(); ++i) {
                if (reference.data().data()[i] == 0.0f) continue;
                ++nonzero;
                flushed += static_cast<float>(cast_result.data().data()[i]) == 0.0f ? 1 : 0;
            }
            return 100.0 * static_cast<double>(flushed) / static_cast<double>(nonzero);
        };
        std::mt19937 rng(23);
        const auto logits = unit_normal(rng, {8, 16384});
        const auto p_now = softmax<unit_scaling>(logits, 1), p_before = softmax<unit_scaling_before>(logits, 1);
        const auto ce_logits = unit_normal(rng, {64, 3000});
        std::vector<std::int32_t> labels(64);
        for (auto& label : labels) label = static_cast<std::int32_t>(rng() % 3000);
        const auto g_now = softmax_cross_entropy<unit_scaling>(ce_logits, labels).grad;
        const auto g_before = softmax_cross_entropy<unit_scaling_before>(ce_logits, labels).grad;
        md.print("\nfp8 casts, share of the non-zero float values flushed to zero: softmax over L = 16,384 cast to "
                 "e4m3fn **{:.2g} %** (before {:.4g} %); cross-entropy gradient at C = 3,000 (batch 64) cast to e5m2 "
                 "**{:.2g} %** (before {:.3g} %).\n",
                 lost(cast<float8_e4m3fn>(p_now), p_now), lost(cast<float8_e4m3fn>(p_before), p_before),
                 lost(cast<float8_e5m2>(g_now), g_now), lost(cast<float8_e5m2>(g_before), g_before));
    }
    fmt::print("wrote {}/unit_scaling_ops.md, unit_scaling_chains.md, unit_scaling_chains.dat, unit_scaling_grads.dat\n", dir);
    return 0;
}
