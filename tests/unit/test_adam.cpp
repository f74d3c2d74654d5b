// ad::adam (AdamW): against a double-precision reference of torch.optim.AdamW's update, with the
// moments in the value domain whatever the parameters' and gradients' scales, its first step,
// decoupled weight decay, low-precision and zero-scale parameters, the errors of misuse, and a
// value_and_grad round trip.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

using namespace scalify;

namespace adam_test {

/// AdamW in double over flat leaves of values: the reference the float32 optimizer must follow.
struct reference_adamw {
    ad::adam_options options;
    std::vector<std::vector<double>> params, m, v;
    int t = 0;

    void step(const std::vector<std::vector<double>>& grads)
    {
        ++t;
        const double correction1 = 1.0 - std::pow(options.beta1, t);
        const double correction2 = 1.0 - std::pow(options.beta2, t);
        for (std::size_t leaf = 0; leaf < params.size(); ++leaf) {
            m.resize(params.size());
            v.resize(params.size());
            m[leaf].resize(params[leaf].size(), 0.0);
            v[leaf].resize(params[leaf].size(), 0.0);
            for (std::size_t i = 0; i < params[leaf].size(); ++i) {
                const double g = grads[leaf][i];
                double& p = params[leaf][i];
                p *= 1.0 - options.learning_rate * options.weight_decay;
                m[leaf][i] = options.beta1 * m[leaf][i] + (1.0 - options.beta1) * g;
                v[leaf][i] = options.beta2 * v[leaf][i] + (1.0 - options.beta2) * g * g;
                const double m_hat = m[leaf][i] / correction1;
                const double v_hat = v[leaf][i] / correction2;
                p -= options.learning_rate * m_hat / (std::sqrt(v_hat) + options.epsilon);
            }
        }
    }
};

template <class P>
std::vector<double> values_of(const ScaledArray<float, P>& a)
{
    const xt::xarray<float> value = a.value();
    return {value.begin(), value.end()};
}

/// Seven steps of AdamW on two float32 leaves at parameter scale `param_scale`, with gradients
/// whose magnitudes and scales change every step (float32 data for leaf 0, bfloat16 for leaf 1):
/// data-domain moments would be off by the ratio of the scales, here up to 2^22.
template <class P>
void check_against_reference(float param_scale, const std::vector<float>& gradient_scales, const ad::adam_options& options)
{
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::vector<std::vector<std::size_t>> shapes{{3, 4}, {5}};

    std::vector<ScaledArray<float, P>> params;
    reference_adamw reference{options, {}, {}, {}};
    for (const auto& shape : shapes) {
        xt::xarray<float> data = xt::xarray<float>::from_shape(shape);
        for (auto& e : data) e = uniform(rng) / param_scale;  // values in [-1, 1]
        params.emplace_back(data, param_scale);
        reference.params.push_back(values_of(params.back()));
    }

    ad::adam optimizer(options);
    for (std::size_t step = 0; step < gradient_scales.size(); ++step) {
        const float g_scale = gradient_scales[step];
        const float magnitude = std::ldexp(1.0f, static_cast<int>(step % 3) * 4 - 4);  // 2^-4, 1, 2^4, ...
        std::vector<ad::gradient<P>> grads;
        std::vector<std::vector<double>> reference_grads;
        for (std::size_t leaf = 0; leaf < shapes.size(); ++leaf) {
            xt::xarray<float> data = xt::xarray<float>::from_shape(shapes[leaf]);
            for (auto& e : data) e = magnitude * normal(rng) / g_scale;
            if (leaf == 0) {
                ScaledArray<float, P> g(data, g_scale);
                reference_grads.push_back(values_of(g));
                grads.emplace_back(std::move(g));
            } else {
                xt::xarray<Eigen::bfloat16> low = xt::cast<Eigen::bfloat16>(data);
                ScaledArray<Eigen::bfloat16, P> g(low, g_scale);
                reference_grads.push_back(values_of(cast<float>(g)));
                grads.emplace_back(std::move(g));
            }
        }
        optimizer.step(params, grads);
        reference.step(reference_grads);
        CHECK(optimizer.steps() == step + 1);
        for (std::size_t leaf = 0; leaf < shapes.size(); ++leaf) {
            CHECK(params[leaf].scale() == param_scale);
            const auto got = values_of(params[leaf]);
            for (std::size_t i = 0; i < got.size(); ++i) {
                INFO("step " << step << ", leaf " << leaf << ", element " << i);
                CHECK(got[i] == Approx(reference.params[leaf][i]).margin(2e-6));
            }
        }
    }
}

template <class A>
struct two_leaves {
    A w, b;
    template <class F>
    friend void for_each_parameter(two_leaves& self, F&& f)
    {
        f(self.w), f(self.b);
    }
};

ScaledArray<float, pow2_scale> filled(std::vector<std::size_t> shape, float value, float scale = 1.0f)
{
    xt::xarray<float> data = xt::xarray<float>::from_shape(shape);
    data.fill(value / scale);
    return {data, scale};
}

}  // namespace adam_test

using namespace adam_test;

TEST_CASE("adam follows a double-precision AdamW over several steps, moments in the value domain", "[adam]")
{
    const ad::adam_options options{.learning_rate = 0.01, .beta1 = 0.8, .beta2 = 0.95, .epsilon = 1e-6, .weight_decay = 0.1};
    const std::vector<float> pow2_gradient_scales{1.0f, 0x1p-10f, 0x1p12f, 0.5f, 0x1p-3f, 0x1p7f, 1.0f};
    SECTION("scale 1") { check_against_reference<pow2_scale>(1.0f, pow2_gradient_scales, options); }
    SECTION("pow2 scale 2^-8") { check_against_reference<pow2_scale>(0x1p-8f, pow2_gradient_scales, options); }
    SECTION("float scale 0.3")
    {
        check_against_reference<float_scale>(0.3f, {1.0f, 7e-4f, 3000.0f, 0.3f, 1.7f, 50.0f, 0.01f}, options);
    }
    SECTION("plain Adam, PyTorch's defaults")
    {
        check_against_reference<pow2_scale>(0x1p-8f, pow2_gradient_scales, ad::adam_options{});
    }
}

TEST_CASE("adam's first step moves every parameter by learning_rate * sign(gradient)", "[adam]")
{
    using A = ScaledArray<float, pow2_scale>;
    A w(xt::xarray<float>{{4.0f, -2.0f, 1.0f}, {0.5f, 8.0f, -6.0f}}, 0.25f);
    const xt::xarray<float> before = w.value();
    // Values 3e-3 .. 3e2 at a scale of 2^-20: the update does not depend on the magnitude.
    const ad::gradient<pow2_scale> g = A(xt::xarray<float>{{3e3f, -1e6f, 0.0f}, {-2e8f, 5e5f, 7e4f}}, 0x1p-20f);
    ad::adam optimizer({.learning_rate = 0.125});
    optimizer.step(w, g);
    const xt::xarray<float> expected = before - 0.125f * xt::xarray<float>{{1, -1, 0}, {-1, 1, 1}};
    CHECK(xt::allclose(w.value(), expected, 0.0, 1e-5));
    CHECK(w.scale() == 0.25f);
    CHECK(optimizer.steps() == 1);
}

TEST_CASE("adam's weight decay is decoupled: p -= lr * weight_decay * p before the step", "[adam]")
{
    using A = ScaledArray<float, pow2_scale>;
    const ad::gradient<pow2_scale> zero = filled({4}, 0.0f, 0x1p5f);
    A decayed = filled({4}, 3.0f, 0x1p-2f);
    A kept = decayed;
    ad::adam with_decay({.learning_rate = 0.1, .weight_decay = 0.5});
    ad::adam without({.learning_rate = 0.1});
    for (int step = 0; step < 3; ++step) {
        with_decay.step(decayed, zero);  // a zero gradient: the Adam step is 0 / (0 + epsilon)
        without.step(kept, zero);
    }
    CHECK(xt::allclose(decayed.value(), xt::xarray<float>{3.0f * std::pow(0.95f, 3.0f)}, 1e-6, 0.0));
    CHECK(xt::all(xt::equal(kept.value(), 3.0f)));

    // With a gradient, decay then step, as torch.optim.AdamW: 2 * (1 - 0.05) - 0.1 * sign(g).
    A p = filled({2}, 2.0f);
    ad::adam({.learning_rate = 0.1, .weight_decay = 0.5}).step(p, ad::gradient<pow2_scale>(filled({2}, -4.0f)));
    CHECK(xt::allclose(p.value(), xt::xarray<float>{1.9f + 0.1f}, 1e-6, 0.0));
}

TEST_CASE("adam rounds low-precision parameters under their scale and leaves zero-scale ones at zero", "[adam]")
{
    // bfloat16 at scale 2^-3: data 8 -> 7.92 (value 0.99) rounds to 7.90625 (bfloat16 spacing 2^-5 below 8).
    ScaledArray<Eigen::bfloat16, pow2_scale> low(xt::xarray<Eigen::bfloat16>{Eigen::bfloat16(8.0f)}, 0x1p-3f);
    ad::adam({.learning_rate = 0.01}).step(low, ad::gradient<pow2_scale>(filled({1}, 3.0f)));
    CHECK(low.scale() == 0x1p-3f);
    CHECK(static_cast<float>(low.data()(0)) == 7.90625f);

    // Too small an update for the format is lost, as under sgd.
    ad::adam({.learning_rate = 1e-3}).step(low, ad::gradient<pow2_scale>(filled({1}, 3.0f)));
    CHECK(static_cast<float>(low.data()(0)) == 7.90625f);

    // float8_e4m3fn saturates instead of overflowing to NaN.
    ScaledArray<float8_e4m3fn, pow2_scale> fp8(xt::xarray<float8_e4m3fn>{float8_e4m3fn(448.0f)}, 1.0f);
    ad::adam({.learning_rate = 10.0}).step(fp8, ad::gradient<pow2_scale>(filled({1}, -1.0f)));
    CHECK(static_cast<float>(fp8.data()(0)) == 448.0f);

    // Scale 0: every value is 0 and the optimizer does not choose a scale, so it stays 0.
    ScaledArray<float, pow2_scale> zero_scale(xt::xarray<float>{1.0f, 2.0f}, 0.0f);
    ad::adam optimizer({.learning_rate = 0.1});
    optimizer.step(zero_scale, ad::gradient<pow2_scale>(filled({2}, 1.0f)));
    CHECK(zero_scale.scale() == 0.0f);
    CHECK(xt::all(xt::equal(zero_scale.value(), 0.0f)));
}

TEST_CASE("adam propagates a non-finite gradient into the parameter", "[adam]")
{
    using A = ScaledArray<float, pow2_scale>;
    A w = filled({3}, 1.0f);
    ad::adam optimizer({});
    optimizer.step(w, ad::gradient<pow2_scale>(A(xt::xarray<float>{1.0f, INFINITY, NAN}, 1.0f)));
    CHECK(std::isfinite(w.value()(0)));
    CHECK(std::isnan(w.value()(1)));
    CHECK(std::isnan(w.value()(2)));
}

TEST_CASE("adam rejects bad options with config_error naming the value", "[adam]")
{
    const auto rejects = [](const ad::adam_options& options, const std::string& name, const std::string& value) {
        try {
            ad::adam optimizer(options);
            FAIL("accepted " << name << " = " << value);
        } catch (const config_error& e) {
            CHECK_THAT(e.what(), Catch::Contains(name) && Catch::Contains(value));
        }
    };
    rejects({.learning_rate = std::nan("")}, "learning_rate", "nan");
    rejects({.learning_rate = INFINITY}, "learning_rate", "inf");
    rejects({.beta1 = 1.0}, "beta1", "1");
    rejects({.beta1 = -0.5}, "beta1", "-0.5");
    rejects({.beta2 = 1.5}, "beta2", "1.5");
    rejects({.beta2 = std::nan("")}, "beta2", "nan");
    rejects({.epsilon = 0.0}, "epsilon", "0");
    rejects({.epsilon = INFINITY}, "epsilon", "inf");
    rejects({.weight_decay = -0.01}, "weight_decay", "-0.01");
    rejects({.weight_decay = INFINITY}, "weight_decay", "inf");
    CHECK_NOTHROW(ad::adam({.beta1 = 0.0, .beta2 = 0.0}));

    ad::adam optimizer({.learning_rate = 0.5});
    optimizer.set_learning_rate(0.25);
    CHECK(optimizer.learning_rate() == 0.25);
    CHECK_THROWS_AS(optimizer.set_learning_rate(INFINITY), config_error);
    CHECK(optimizer.learning_rate() == 0.25);
}

TEST_CASE("adam throws shape_error for mismatched trees, before changing anything", "[adam]")
{
    using A = ScaledArray<float, pow2_scale>;
    using G = ad::gradient<pow2_scale>;
    std::vector<A> params{filled({2, 3}, 1.0f), filled({3}, 2.0f)};
    const std::vector<G> grads{filled({2, 3}, 0.5f), filled({3}, 0.5f)};
    ad::adam optimizer({.learning_rate = 0.1});

    // Params and gradients of different structure or shapes: nothing moves.
    CHECK_THROWS_AS(optimizer.step(params, std::vector<G>{filled({2, 3}, 0.5f)}), shape_error);
    CHECK_THROWS_WITH(optimizer.step(params, std::vector<G>{filled({2, 3}, 0.5f), filled({4}, 0.5f)}),
                      Catch::Contains("leaf 1") && Catch::Contains("(4,)") && Catch::Contains("(3,)"));
    CHECK_THROWS_AS(optimizer.step(params, std::vector<G>{filled({2, 3}, 0.5f), G{}}), autodiff_error);
    CHECK(optimizer.steps() == 0);
    CHECK(xt::all(xt::equal(params[0].value(), 1.0f)));

    optimizer.step(params, grads);
    const auto after_first = params;

    // A tree that differs from the first step's: more or fewer leaves, another shape.
    std::vector<A> more = params;
    more.push_back(filled({3}, 1.0f));
    std::vector<G> more_grads = grads;
    more_grads.push_back(filled({3}, 1.0f));
    CHECK_THROWS_WITH(optimizer.step(more, more_grads), Catch::Contains("2 leaves"));
    std::vector<A> fewer{params[0]};
    CHECK_THROWS_WITH(optimizer.step(fewer, std::vector<G>{grads[0]}), Catch::Contains("1 leaves, 2 at the first step"));
    std::vector<A> reshaped{filled({3, 2}, 1.0f), params[1]};
    CHECK_THROWS_WITH(optimizer.step(reshaped, std::vector<G>{filled({3, 2}, 0.5f), grads[1]}),
                      Catch::Contains("leaf 0") && Catch::Contains("(3, 2)") && Catch::Contains("(2, 3)"));
    CHECK(optimizer.steps() == 1);
    for (std::size_t leaf = 0; leaf < params.size(); ++leaf) {
        CHECK(xt::all(xt::equal(params[leaf].value(), after_first[leaf].value())));
    }
}

TEST_CASE("adam minimises a quadratic through value_and_grad", "[adam]")
{
    using A = ScaledArray<float, pow2_scale>;
    two_leaves<A> params{A(xt::xarray<float>{{0.5f, -1.0f}, {2.0f, 0.0f}}, 0x1p-4f), filled({2}, 0.0f, 8.0f)};
    const A target_w = as_scaled_array<pow2_scale>(xt::xarray<float>{{0.1f, 0.2f}, {-0.3f, 0.4f}});
    const A target_b = as_scaled_array<pow2_scale>(xt::xarray<float>{-1.5f, 0.75f});
    const auto loss = [&](const auto& p) {
        const auto dw = p.w - target_w;
        const auto db = p.b - target_b;
        return reduce_sum(dw * dw) + reduce_sum(db * db) * 0.01;  // b's gradient 100x smaller: Adam does not care
    };

    ad::adam optimizer({.learning_rate = 0.05});
    double first_loss = 0.0, last_loss = 0.0;
    const int steps = 400;
    for (int step = 0; step < steps; ++step) {
        optimizer.set_learning_rate(0.05 * (1.0 - double(step) / steps) + 1e-4);  // linear decay
        auto [value, grads] = ad::value_and_grad<natural_scaling>(loss, params);
        last_loss = static_cast<double>(value.value()());
        if (step == 0) first_loss = last_loss;
        optimizer.step(params, grads);
    }
    CHECK(last_loss < 1e-4 * first_loss);
    CHECK(xt::allclose(params.w.value(), target_w.value(), 0.0, 1e-2));
    CHECK(xt::allclose(params.b.value(), target_b.value(), 0.0, 1e-2));
    CHECK(params.w.scale() == 0x1p-4f);
    CHECK(params.b.scale() == 8.0f);
}
