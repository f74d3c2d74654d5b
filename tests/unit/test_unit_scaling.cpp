// unit_scaling's rules: for unit-normal input data every op and every VJP stores its result at
// data RMS 0.7 ... 1.4 (softmax lengths 8 ... 65,536, cross-entropy class counts 2 ... 100,000);
// 16-layer relu / gelu MLPs and an e4m3fn residual stream stay within 0.5 ... 2 at every layer;
// fp8 casts of softmax and cross-entropy gradients keep their values; the pow2 tie rule; gradient
// tags are specialisable. Fixed seeds throughout.
#include "../support/unit_weights.hpp"

#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace scalify;
using Catch::Matchers::Contains;

namespace {

using array = ScaledArray<float, float_scale>;

/// Data i.i.d. N(0, 1) (or e^N(0, 1) for positive-domain ops) at `scale`.
array unit_normal(std::mt19937& rng, std::vector<std::size_t> shape, float scale = 1.0f)
{
    std::normal_distribution<float> normal;
    xt::xarray<float> data = xt::xarray<float>::from_shape(shape);
    for (auto& x : data) x = normal(rng);
    return array(std::move(data), scale);
}
array log_normal(std::mt19937& rng, std::vector<std::size_t> shape, float scale = 1.0f)
{
    array a = unit_normal(rng, std::move(shape), scale);
    xt::xarray<float> data = a.data();
    for (auto& x : data) x = std::exp(x);
    return array(std::move(data), scale);
}

template <class T, class P>
double data_rms(const ScaledArray<T, P>& a)
{
    double sum = 0.0;
    for (const auto& x : a.data()) {
        const double v = static_cast<double>(detail::load(x));
        sum += v * v;
    }
    return a.size() ? std::sqrt(sum / static_cast<double>(a.size())) : 0.0;
}

template <class T, class P>
bool all_finite(const ScaledArray<T, P>& a)
{
    for (const auto& x : a.data()) {
        if (!std::isfinite(static_cast<double>(detail::load(x)))) return false;
    }
    return true;
}

#define CHECK_UNIT_RMS(what, result)                                                             \
    do {                                                                                         \
        const double rms_ = data_rms(result);                                                    \
        INFO(what << ": data RMS " << rms_ << " (scale " << (result).scale() << ")");            \
        CHECK(rms_ >= 0.7);                                                                      \
        CHECK(rms_ <= 1.4);                                                                      \
    } while (0)

using unit = unit_scaling;

}  // namespace

TEST_CASE("unit_scaling: element-wise ops and their VJPs keep unit-normal data at unit RMS", "[unit_scaling]")
{
    std::mt19937 rng(18);
    const std::vector<std::size_t> shape{64, 256};
    for (const float s : {0.125f, 1.0f, 8.0f}) {
        const std::string at = " at scale " + std::to_string(s);
        const auto x = unit_normal(rng, shape, s);
        const auto g = unit_normal(rng, shape, 0.5f);
        CHECK_UNIT_RMS("relu" + at, relu<unit>(x));
        CHECK_UNIT_RMS("gelu" + at, gelu<unit>(x));
        CHECK_UNIT_RMS("tanh" + at, tanh<unit>(x));
        CHECK_UNIT_RMS("relu_vjp" + at, relu_vjp<unit>(g, x));
        CHECK_UNIT_RMS("gelu_vjp" + at, gelu_vjp<unit>(g, x));
        CHECK_UNIT_RMS("tanh_vjp" + at, tanh_vjp<unit>(g, x));
        // Positive-domain ops: log-normal data (see strategy/scaling.hpp).
        const auto positive = log_normal(rng, shape, s);
        CHECK_UNIT_RMS("log" + at, log<unit>(positive));
        CHECK_UNIT_RMS("log_vjp" + at, log_vjp<unit>(g, positive));
        const auto root = sqrt<unit>(positive);
        CHECK_UNIT_RMS("sqrt" + at, root);
        CHECK_UNIT_RMS("sqrt_vjp" + at, sqrt_vjp<unit>(g, root));
    }
    // exp's second moment e^(2 s^2) is carried by samples a tensor holds only for s up to ~1.
    for (const float s : {0.25f, 1.0f}) {
        const auto x = unit_normal(rng, shape, s);
        const auto y = exp<unit>(x);
        CHECK_UNIT_RMS("exp at scale " + std::to_string(s), y);
        CHECK_UNIT_RMS("exp_vjp at scale " + std::to_string(s), exp_vjp<unit>(unit_normal(rng, shape, 2.0f), y));
    }
}

TEST_CASE("unit_scaling: add, sub, mul with broadcasting and one-element operands, and their VJPs", "[unit_scaling]")
{
    std::mt19937 rng(19);
    const auto a = unit_normal(rng, {64, 256}, 1.0f);
    const auto scaled = unit_normal(rng, {64, 256}, 4.0f);
    const auto row = unit_normal(rng, {256}, 0.25f);
    const auto g = unit_normal(rng, {64, 256}, 1.0f);
    for (const float c : {3.0f, 0.1f, -2.0f}) {
        const auto constant = make_scaled_array(xt::xarray<float>{c}, 1.0f);
        const std::string at = " with the one-element operand " + std::to_string(c);
        CHECK_UNIT_RMS("add" + at, add<unit>(a, constant));
        CHECK_UNIT_RMS("sub" + at, sub<unit>(constant, a));
        CHECK_UNIT_RMS("mul" + at, mul<unit>(a, constant));
        CHECK_UNIT_RMS("mul_vjp a" + at, mul_vjp<unit>(g, a, constant).first);
        // The constant's gradient is one sum of 16384 terms: one sample of its distribution, so
        // its RMS is taken over independent cotangents.
        std::vector<array> gc, add_gc;
        for (int draw = 0; draw < 32; ++draw) {
            const auto gi = unit_normal(rng, {64, 256});
            gc.push_back(mul_vjp<unit>(gi, a, constant).second);
            add_gc.push_back(add_vjp<unit>(gi, a.shape(), constant.shape()).second);
        }
        CHECK_UNIT_RMS("mul_vjp c over 32 cotangents" + at, concatenate(gc));
        CHECK_UNIT_RMS("add_vjp c over 32 cotangents" + at, concatenate(add_gc));
    }
    CHECK_UNIT_RMS("add, equal shapes", add<unit>(a, scaled));
    CHECK_UNIT_RMS("sub, equal shapes", sub<unit>(scaled, a));
    CHECK_UNIT_RMS("add, broadcast row", add<unit>(a, row));
    CHECK_UNIT_RMS("mul, equal shapes", mul<unit>(a, scaled));
    CHECK_UNIT_RMS("mul, broadcast row", mul<unit>(scaled, row));
    const auto [ga, grow] = add_vjp<unit>(g, a.shape(), row.shape());
    CHECK_UNIT_RMS("add_vjp a", ga);
    CHECK_UNIT_RMS("add_vjp broadcast row", grow);
    const auto [sa, srow] = sub_vjp<unit>(g, a.shape(), row.shape());
    CHECK_UNIT_RMS("sub_vjp broadcast row", srow);
    const auto [ma, mrow] = mul_vjp<unit>(g, scaled, row);
    CHECK_UNIT_RMS("mul_vjp a", ma);
    CHECK_UNIT_RMS("mul_vjp broadcast row", mrow);
}

TEST_CASE("unit_scaling: reductions, concatenate and their VJPs", "[unit_scaling]")
{
    std::mt19937 rng(20);
    const auto x = unit_normal(rng, {64, 256}, 2.0f);
    CHECK_UNIT_RMS("reduce_sum axis 1", reduce_sum<unit>(x, {1}));
    CHECK_UNIT_RMS("reduce_sum all", reduce_sum<unit>(unit_normal(rng, {4096, 1}, 1.0f), {1}));
    CHECK_UNIT_RMS("reduce_mean axis 0", reduce_mean<unit>(x, {0}));
    CHECK_UNIT_RMS("reduce_mean axis 1", reduce_mean<unit>(x, {1}));
    const auto g_rows = unit_normal(rng, {64}, 1.0f);
    CHECK_UNIT_RMS("reduce_sum_vjp", reduce_sum_vjp(g_rows, x.shape(), {1}));
    CHECK_UNIT_RMS("reduce_mean_vjp", reduce_mean_vjp<unit>(g_rows, x.shape(), {1}));
    const auto [gx, gw] = matmul_vjp<unit>(unit_normal(rng, {64, 128}), x, unit_normal(rng, {256, 128}, 0.0625f));
    CHECK_UNIT_RMS("matmul_vjp a", gx);
    CHECK_UNIT_RMS("matmul_vjp b", gw);

    // Parts of different scales and sizes: the result is at their RMS scale.
    const auto p1 = unit_normal(rng, {64, 100}, 1.0f), p2 = unit_normal(rng, {64, 30}, 16.0f),
               p3 = unit_normal(rng, {64, 126}, 0.25f);
    const auto joined = concatenate<unit>({p1, p2, p3}, 1);
    CHECK_UNIT_RMS("concatenate", joined);
    CHECK(joined.value()(3, 110) == Approx(p2.value()(3, 10)));
    const auto pieces = concatenate_vjp(unit_normal(rng, {64, 256}), {100, 30, 126}, 1);
    REQUIRE(pieces.size() == 3);
    for (const auto& piece : pieces) CHECK_UNIT_RMS("concatenate_vjp piece", piece);
    CHECK(pieces[1].shape()[1] == 30);
    CHECK_THROWS_WITH(concatenate_vjp(joined, {100, 30}, 1), Contains("part extents (100, 30) along axis 1"));
}

TEST_CASE("unit_scaling: softmax and log_softmax over lengths 8 ... 65536, and their VJPs", "[unit_scaling][softmax]")
{
    std::mt19937 rng(21);
    for (const std::size_t length : {8u, 100u, 1000u, 16384u, 65536u}) {
        const std::size_t rows = std::clamp<std::size_t>((std::size_t{1} << 17) / length, 8, 512);
        const std::string at = " over L = " + std::to_string(length);
        const auto logits = unit_normal(rng, {rows, length});
        const auto g = unit_normal(rng, {rows, length}, 0.5f);
        const auto p = softmax<unit>(logits, 1);
        CHECK_UNIT_RMS("softmax" + at, p);
        CHECK_UNIT_RMS("softmax_vjp" + at, softmax_vjp<unit>(g, p, 1));
        const auto lp = log_softmax<unit>(logits, 1);
        CHECK_UNIT_RMS("log_softmax" + at, lp);
        CHECK_UNIT_RMS("log_softmax_vjp" + at, log_softmax_vjp<unit>(g, lp, 1));
    }
    // Along a leading axis too.
    const auto columns = unit_normal(rng, {512, 16});
    CHECK_UNIT_RMS("softmax along axis 0", softmax<unit>(columns, 0));
}

TEST_CASE("unit_scaling: softmax cross-entropy gradient over classes 2 ... 100000, batch 8 ... 512", "[unit_scaling][softmax]")
{
    std::mt19937 rng(22);
    const std::pair<std::size_t, std::size_t> cases[] = {{2, 8}, {2, 512}, {12, 64}, {3000, 64}, {100000, 8}};
    for (const auto& [classes, batch] : cases) {
        const auto logits = unit_normal(rng, {batch, classes});
        std::vector<std::int32_t> labels(batch);
        std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(classes) - 1);
        for (auto& label : labels) label = pick(rng);
        const auto ce = softmax_cross_entropy<unit>(logits, labels);
        CHECK_UNIT_RMS("cross-entropy gradient, C = " + std::to_string(classes) + ", B = " + std::to_string(batch), ce.grad);
        // Same loss and gradient values as the default strategy's.
        const auto reference = softmax_cross_entropy(logits, labels);
        CHECK(ce.loss == reference.loss);
        const xt::xarray<float> got = ce.grad.value(), want = reference.grad.value();
        for (std::size_t i = 0; i < got.size(); i += 97) {
            CHECK(std::abs(got.data()[i] - want.data()[i]) <= 1e-6f * std::abs(want.data()[i]) + 1e-12f);
        }
    }
}

TEST_CASE("unit_scaling: fp8 casts of softmax (L = 16384, e4m3fn) and the cross-entropy gradient (C = 3000, e5m2)",
          "[unit_scaling][fp8]")
{
    std::mt19937 rng(23);
    const auto zero_fraction = [](const auto& cast_result, const array& reference) {
        std::size_t lost = 0, nonzero = 0;
        for (std::size_t i = 0; i < reference.size(); ++i) {
            if (reference.data().data()[i] == 0.0f) continue;
            ++nonzero;
            lost += static_cast<float>(cast_result.data().data()[i]) == 0.0f ? 1 : 0;
        }
        return static_cast<double>(lost) / static_cast<double>(nonzero);
    };
    const auto logits = unit_normal(rng, {8, 16384});
    const auto p = softmax<unit>(logits, 1);
    const double softmax_zeros = zero_fraction(cast<float8_e4m3fn>(p), p);
    INFO("softmax at L = 16384 cast to e4m3fn: " << 100 * softmax_zeros << " % zeros (was 99.95 % at scale 1)");
    CHECK(softmax_zeros <= 0.01);

    const auto ce_logits = unit_normal(rng, {64, 3000});
    std::vector<std::int32_t> labels(64);
    for (auto& label : labels) label = static_cast<std::int32_t>(rng() % 3000);
    const auto grad = softmax_cross_entropy<unit>(ce_logits, labels).grad;
    const double ce_zeros = zero_fraction(cast<float8_e5m2>(grad), grad);
    INFO("cross-entropy gradient at C = 3000 cast to e5m2: " << 100 * ce_zeros << " % zeros (was 81 % at scale 1)");
    CHECK(ce_zeros <= 0.01);
    const double default_zeros = zero_fraction(cast<float8_e5m2>(softmax_cross_entropy(ce_logits, labels).grad), grad);
    CHECK(default_zeros > 0.5);  // the default strategy's scale-1 gradient, for contrast
}

namespace {

/// Layer `layer`'s fan_in x fan_out unit-variance weights at scale 1/sqrt(fan_in): values of
/// variance 1/fan_in (tests/support/unit_weights.hpp).
array layer_weights(std::size_t layer, std::size_t fan_in, std::size_t fan_out)
{
    return testing::unit_weights<float_scale>(1000 + layer, fan_in, fan_out);
}

/// Data RMS of every layer's activation and weight gradient in an MLP x <- act(x W).
struct chain_rms {
    std::vector<double> forward, weight_gradient;
};

/// widths: the 17 activation widths of a 16-layer MLP (the layer fan-ins are all but the last).
template <class Act, class ActVjp>
chain_rms mlp_chain(const std::vector<std::size_t>& widths, std::size_t batch, Act act, ActVjp act_vjp)
{
    const std::size_t depth = widths.size() - 1;
    std::mt19937 rng(static_cast<std::uint32_t>(widths[0] + batch));
    chain_rms out;
    std::vector<array> weights, inputs{unit_normal(rng, {batch, widths[0]})}, pre_activations;
    for (std::size_t l = 0; l < depth; ++l) {
        weights.push_back(layer_weights(l, widths[l], widths[l + 1]));
        pre_activations.push_back(matmul<unit>(inputs.back(), weights.back()));
        inputs.push_back(act(pre_activations.back()));
        out.forward.push_back(data_rms(inputs.back()));
    }
    array g = unit_normal(rng, {batch, widths.back()});
    out.weight_gradient.resize(depth);
    for (std::size_t l = depth; l-- > 0;) {
        const auto gh = act_vjp(g, pre_activations[l]);
        auto [gx, gw] = matmul_vjp<unit>(gh, inputs[l], weights[l]);
        out.weight_gradient[l] = data_rms(gw);
        g = std::move(gx);
    }
    return out;
}

void check_chain(const std::string& what, const chain_rms& rms)
{
    for (std::size_t l = 0; l < rms.forward.size(); ++l) {
        INFO(what << " layer " << l + 1 << ": forward data RMS " << rms.forward[l] << ", weight gradient "
                  << rms.weight_gradient[l]);
        CHECK(rms.forward[l] >= 0.5);
        CHECK(rms.forward[l] <= 2.0);
        CHECK(rms.weight_gradient[l] >= 0.5);
        CHECK(rms.weight_gradient[l] <= 2.0);
    }
}

}  // namespace

TEST_CASE("unit_scaling: 16-layer relu and gelu MLPs stay at unit data RMS, forward and weight gradients",
          "[unit_scaling][chains]")
{
    const auto relu_act = [](const array& h) { return relu<unit>(h); };
    const auto relu_back = [](const array& g, const array& h) { return relu_vjp<unit>(g, h); };
    const auto gelu_act = [](const array& h) { return gelu<unit>(h); };
    const auto gelu_back = [](const array& g, const array& h) { return gelu_vjp<unit>(g, h); };
    // Contractions K = 1024 or 4096 alternating with 256 (bottleneck MLPs) cover the range
    // without sixteen 4096 x 4096 weights (tools/unit_scaling_report runs square K = 4096 too).
    const auto bottleneck = [](std::size_t wide) {
        std::vector<std::size_t> widths(17, wide);
        for (std::size_t l = 1; l < widths.size(); l += 2) widths[l] = 256;
        return widths;
    };
    check_chain("relu K = 256", mlp_chain(std::vector<std::size_t>(17, 256), 64, relu_act, relu_back));
    check_chain("gelu K = 256", mlp_chain(std::vector<std::size_t>(17, 256), 64, gelu_act, gelu_back));
    check_chain("gelu K = 1024 / 256", mlp_chain(bottleneck(1024), 16, gelu_act, gelu_back));
    check_chain("relu K = 4096 / 256", mlp_chain(bottleneck(4096), 16, relu_act, relu_back));
}

namespace {

/// 16 layers of x <- x + x W stored in e4m3fn; `after_add` is the recipe's step (or nothing).
/// Returns every layer's data RMS, or NaN for a layer whose data hold NaN or inf.
template <class P, class AfterAdd>
std::vector<double> residual_stream(AfterAdd after_add)
{
    constexpr std::size_t k = 256, batch = 64, depth = 16;
    std::mt19937 rng(24);
    using fp8 = ScaledArray<float8_e4m3fn, P>;
    const auto to_fp8 = [](const array& a) { return cast<float8_e4m3fn>(a.with_policy<P>()); };
    fp8 x = to_fp8(unit_normal(rng, {batch, k}));
    std::vector<double> rms;
    for (std::size_t l = 0; l < depth; ++l) {
        const fp8 w = to_fp8(layer_weights(l, k, k));  // scale 1/16, a power of two
        x = after_add(l, add<unit>(x, matmul<unit>(x, w)));
        rms.push_back(all_finite(x) ? data_rms(x) : std::numeric_limits<double>::quiet_NaN());
    }
    return rms;
}

void check_stream(const std::string& what, const std::vector<double>& rms)
{
    for (std::size_t l = 0; l < rms.size(); ++l) {
        INFO(what << " layer " << l + 1 << ": data RMS " << rms[l] << " (NaN: NaN or inf in the data)");
        CHECK(rms[l] >= 0.5);
        CHECK(rms[l] <= 2.0);
    }
}

}  // namespace

TEST_CASE("unit_scaling: a 16-layer e4m3fn residual stream, float scales and the pow2 recipe", "[unit_scaling][chains]")
{
    const auto nothing = [](std::size_t, auto x) { return x; };
    check_stream("float scales", residual_stream<float_scale>(nothing));

    // pow2_scale alone: sqrt(sa^2 + sb^2) = sqrt(2) s rounds up (ties up) at every layer while the
    // value grows by sqrt(2), so the data decay by 1/sqrt(2) per layer: 2^-8 after 16 layers.
    const auto drifting = residual_stream<pow2_scale>(nothing);
    CHECK(drifting.back() < 0.01);

    // The recipe (docs/ops.md): dynamic_rescale_l2 after each residual add moves the data RMS
    // back into [1/sqrt(2), sqrt(2)] with an exact power-of-two factor; every second add is
    // enough to stay within [1/2, sqrt(2)].
    check_stream("pow2, rescale every layer", residual_stream<pow2_scale>([](std::size_t, auto x) { return dynamic_rescale_l2(x); }));
    check_stream("pow2, rescale every second layer", residual_stream<pow2_scale>([](std::size_t l, auto x) {
                     return l % 2 == 1 ? dynamic_rescale_l2(x) : x;
                 }));
}

TEST_CASE("pow2_scale: the tie sqrt(2) * 2^k rounds up, as documented", "[unit_scaling][pow2]")
{
    const float sqrt2 = std::sqrt(2.0f);  // 1.41421354f, just below sqrt(2): the tie
    CHECK(pow2_round_nearest(sqrt2) == 2.0f);
    CHECK(pow2_round_nearest(std::nextafter(sqrt2, 0.0f)) == 1.0f);
    CHECK(pow2_round_nearest(sqrt2 * 0x1p-140f) == 0x1p-139f);  // subnormal: the nearest subnormal is the tie
    CHECK(pow2_round_nearest(std::nextafter(sqrt2 * 0x1p-140f, 0.0f)) == 0x1p-140f);
    CHECK(pow2_round_nearest(0x1p-149f) == 0x1p-149f);
    CHECK(pow2_round_nearest(3 * 0x1p-149f) == 0x1p-147f);
    CHECK(pow2_round_nearest(std::numeric_limits<float>::max()) == 0x1p127f);  // 2^128 is not a float
    CHECK(pow2_scale::from_rule(0.7f) == 0.5f);
    CHECK(pow2_scale::from_rule(0.75f) == 1.0f);
    // Equal scales under unit_scaling's add: sqrt(2) s -> 2 s.
    const auto a = make_scaled_array<pow2_scale>(xt::xarray<float>{1.0f, -1.0f}, 4.0f);
    CHECK(add<unit>(a, a).scale() == 8.0f);
    CHECK((add<unit>(a, a).value() == xt::xarray<float>{8.0f, -8.0f}));
}

TEST_CASE("unit_scaling: rules derived from the unit-normal moments", "[unit_scaling]")
{
    namespace un = detail::unit_normal;
    // Graphcore unit-scaling's empirical constants: gelu's gradient 1/0.675; gelu's 0.588 is the
    // standard deviation, whose RMS (the magnitude fp8 sees) is 0.652.
    CHECK(un::gelu_grad_rms(1.0) == Approx(0.675).epsilon(0.002));
    CHECK(un::gelu_rms(1.0) == Approx(std::sqrt(0.588 * 0.588 + 1.0 / (4.0 * 3.14159265358979))).epsilon(0.002));
    CHECK(un::relu_rms(2.0) == Approx(std::sqrt(2.0)));
    CHECK(un::tanh_rms(1e-3) == Approx(1e-3).epsilon(1e-3));
    // softmax: E[sum p^2] -> e^(sigma^2) / L for long axes (unit-scaling's 1.31 is sqrt(e - 1), the
    // standard deviation), 1/L for flat logits, and L = 2 at sigma = 1 against Monte Carlo.
    CHECK(un::softmax_sum_squares(65536, 1.0) * 65536 == Approx(std::exp(1.0)).epsilon(0.003));
    CHECK(un::softmax_sum_squares(1000, 0.0) == Approx(1e-3));
    CHECK(un::softmax_sum_squares(2, 1.0) == Approx(1.1285 * 1.1285 / 2).epsilon(0.003));
    CHECK(un::softmax_sum_squares(2147483648.0, 1.0) * 2147483648.0 == Approx(std::exp(1.0)).epsilon(0.003));  // 2^31 classes
    // Degenerate inputs fall back to the natural scale: zero-scale softmax is uniform, log of a
    // zero-scale array is -inf at scale 1.
    const auto zeros = make_scaled_array(xt::xarray<float>{0.0f, 0.0f}, 0.0f);
    CHECK(softmax<unit>(zeros, 0).value()(0) == Approx(0.5f));
    CHECK(log<unit>(zeros).scale() == 1.0f);
    CHECK(relu<unit>(zeros).scale() == 0.0f);
    CHECK(tanh<unit>(zeros).scale() == 0.0f);
}

TEST_CASE("softmax_cross_entropy: any integer label type, braced labels, errors naming the values", "[unit_scaling][errors]")
{
    std::mt19937 rng(25);
    const auto logits = unit_normal(rng, {3, 5});
    const auto with_u8 = softmax_cross_entropy(logits, std::vector<std::uint8_t>{4, 0, 2});
    const auto with_i32 = softmax_cross_entropy(logits, std::vector<std::int32_t>{4, 0, 2});
    const auto with_i64 = softmax_cross_entropy<unit>(logits, std::vector<std::int64_t>{4, 0, 2});
    const auto braced = softmax_cross_entropy(logits, {4, 0, 2});
    CHECK(with_u8.loss == with_i32.loss);
    CHECK(with_i64.loss == with_i32.loss);
    CHECK(braced.loss == with_i32.loss);
    CHECK((with_u8.grad.value() == with_i32.grad.value()));
    CHECK(with_u8.grad.scale() == 1.0f);  // default_scaling: the gradient itself, as before
    CHECK_THROWS_MATCHES(softmax_cross_entropy(logits, std::vector<std::int32_t>{4, -1, 2}), shape_error,
                         Catch::Matchers::Message("softmax_cross_entropy: label -1 out of range for 5 classes (row 1)"));
    CHECK_THROWS_WITH(softmax_cross_entropy(logits, std::vector<std::int64_t>{4, 0, std::int64_t{1} << 40}),
                      Contains("label 1099511627776 out of range for 5 classes (row 2)"));
    CHECK_THROWS_WITH(softmax_cross_entropy(logits, std::vector<std::uint32_t>{2147483648u, 0, 0}),
                      Contains("label 2147483648 out of range"));
    CHECK_THROWS_WITH(softmax_cross_entropy(logits, std::vector<int>{1, 2}), Contains("logits (3, 5) and 2 labels do not match"));
}

TEST_CASE("VJP shape errors name the shapes", "[unit_scaling][errors]")
{
    const auto y = make_scaled_array(xt::xarray<float>::from_shape({2, 3}), 1.0f);
    const auto g = make_scaled_array(xt::xarray<float>::from_shape({3, 2}), 1.0f);
    CHECK_THROWS_MATCHES(softmax_vjp(g, y, 1), shape_error,
                         Catch::Matchers::Message("softmax_vjp: cotangent shape (3, 2) differs from the forward value's (2, 3)"));
    CHECK_THROWS_WITH(log_softmax_vjp(y, y, 2), Contains("log_softmax_vjp: axis 2 out of range for shape (2, 3)"));
    CHECK_THROWS_WITH(reduce_sum_vjp(g, y.shape(), {5}), Contains("reduce_sum_vjp: axes [5]"));
    CHECK_THROWS_WITH(reduce_mean_vjp(g, y.shape(), {0, 0}), Contains("reduce_mean_vjp: axes [0, 0]"));
    CHECK_THROWS_WITH(add_vjp(y, std::vector<std::size_t>{4}, y.shape()),
                      Contains("operand shape (4,) does not broadcast to the cotangent's shape (2, 3)"));
    // reduce_mean of nothing is NaN, as numpy's.
    const auto empty = make_scaled_array(xt::xarray<float>::from_shape({0, 3}), 1.0f);
    CHECK(std::isnan(reduce_mean(empty, {0}).value()(1)));
}

// A project that wants headroom on every gradient: one partial specialisation over all VJP tags,
// and one rule for gelu's gradient alone. Forward ops keep unit_scaling's rules.
namespace {
struct gradient_headroom : unit_scaling {};
}  // namespace

template <class Op, std::size_t Input>
struct scalify::scaling_traits<scalify::ops::vjp<Op, Input>, gradient_headroom> {
    template <ScalePolicy Policy>
    static float output_scale(const scale_request& request)
    {
        return 4.0f * unit_scaling::output_scale<Policy>(ops::vjp<Op, Input>{}, request);
    }
};
template <>
struct scalify::scaling_traits<scalify::ops::vjp<scalify::ops::gelu>, gradient_headroom> {
    template <ScalePolicy Policy>
    static float output_scale(const scale_request&)
    {
        return 1.0f;
    }
};

TEST_CASE("gradient tags: a strategy gives gradients their own scales, ops unchanged", "[unit_scaling][strategies]")
{
    std::mt19937 rng(26);
    const auto x = unit_normal(rng, {32, 64});
    const auto g = unit_normal(rng, {32, 64});
    static_assert(ScalingStrategy<gradient_headroom>);
    CHECK(relu<gradient_headroom>(x).scale() == relu<unit>(x).scale());
    CHECK(relu_vjp<gradient_headroom>(g, x).scale() == 4.0f * relu_vjp<unit>(g, x).scale());
    CHECK(gelu_vjp<gradient_headroom>(g, x).scale() == 1.0f);
    const auto a = gelu_vjp<gradient_headroom>(g, x).value(), b = gelu_vjp<unit>(g, x).value();
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a.data()[i] == Approx(b.data()[i]).margin(1e-6));
    std::vector<std::int32_t> labels(32, 3);
    CHECK(softmax_cross_entropy<gradient_headroom>(x, labels).grad.scale() ==
          4.0f * softmax_cross_entropy<unit>(x, labels).grad.scale());
}
