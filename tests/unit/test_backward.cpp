// Backward rules against central finite differences in double.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

using namespace scalify;
using array = ScaledArray<double, float_scale>;

namespace {

array random_double_array(std::mt19937& rng, std::vector<std::size_t> shape, float scale, double lo = -2.0, double hi = 2.0,
                   bool away_from_zero = false)
{
    std::uniform_real_distribution<double> uniform(lo, hi);
    xt::xarray<double> x = xt::xarray<double>::from_shape(shape);
    for (auto& e : x) {
        do e = uniform(rng);
        while (away_from_zero && std::abs(e) < 0.3);
    }
    return array(x, scale);
}

double dot(const array& a, const array& r)
{
    const xt::xarray<double> va = a.value(), vr = r.value();
    double s = 0;
    for (std::size_t i = 0; i < va.size(); ++i) s += va.data()[i] * vr.data()[i];
    return s;
}

/// Checks grad (the VJP's result for cotangent r) against d/dx of sum(r * f(x)), element by element.
void check_gradient(const char* name, const std::function<array(const array&)>& f, const array& x, const array& r,
                    const array& grad, double tolerance = 1e-6)
{
    INFO(name);
    const xt::xarray<double> g = grad.value();
    REQUIRE(g.shape() == x.shape());
    const double h = 1e-6;
    for (std::size_t i = 0; i < x.size(); ++i) {
        xt::xarray<double> plus = x.value(), minus = x.value();
        plus.data()[i] += h;
        minus.data()[i] -= h;
        const double numeric = (dot(f(array(plus, 1.0f)), r) - dot(f(array(minus, 1.0f)), r)) / (2 * h);
        CHECK(std::abs(g.data()[i] - numeric) <= tolerance * (1 + std::abs(numeric)));
    }
}

}  // namespace

TEST_CASE("binary backward rules match finite differences", "[backward]")
{
    std::mt19937 rng(1);
    const auto a = random_double_array(rng, {3, 4}, 0.5f), b = random_double_array(rng, {4, 5}, 4.0f);
    const auto r = random_double_array(rng, {3, 5}, 2.0f);
    const auto [ga, gb] = matmul_vjp(r, a, b);
    check_gradient("matmul a", [&](const array& x) { return matmul(x, b); }, a, r, ga);
    check_gradient("matmul b", [&](const array& x) { return matmul(a, x); }, b, r, gb);
    const auto [ga_unit, gb_unit] = matmul_vjp<unit_scaling>(r, a, b);
    check_gradient("matmul a, unit_scaling", [&](const array& x) { return matmul(x, b); }, a, r, ga_unit);

    const auto c = random_double_array(rng, {3, 4}, 0.25f), d = random_double_array(rng, {4}, 3.0f, -2, 2, true);
    const auto rc = random_double_array(rng, {3, 4}, 1.0f);
    const auto add_g = add_vjp(rc, c.shape(), d.shape());
    check_gradient("add a", [&](const array& x) { return add(x, d); }, c, rc, add_g.first);
    check_gradient("add b (broadcast)", [&](const array& x) { return add(c, x); }, d, rc, add_g.second);
    const auto sub_g = sub_vjp(rc, c.shape(), d.shape());
    check_gradient("sub b", [&](const array& x) { return sub(c, x); }, d, rc, sub_g.second);
    const auto mul_g = mul_vjp(rc, c, d);
    check_gradient("mul a", [&](const array& x) { return mul(x, d); }, c, rc, mul_g.first);
    check_gradient("mul b", [&](const array& x) { return mul(c, x); }, d, rc, mul_g.second);
    const auto div_g = div_vjp(rc, c, d);
    check_gradient("div a", [&](const array& x) { return div(x, d); }, c, rc, div_g.first);
    check_gradient("div b", [&](const array& x) { return div(c, x); }, d, rc, div_g.second);
    const auto e = random_double_array(rng, {3, 4}, 0.5f);
    const auto max_g = maximum_vjp(rc, c, e);
    check_gradient("maximum a", [&](const array& x) { return maximum(x, e); }, c, rc, max_g.first);
    check_gradient("maximum b", [&](const array& x) { return maximum(c, x); }, e, rc, max_g.second);
    const auto min_g = minimum_vjp(rc, c, e);
    check_gradient("minimum a", [&](const array& x) { return minimum(x, e); }, c, rc, min_g.first);
}

TEST_CASE("unary backward rules match finite differences", "[backward]")
{
    std::mt19937 rng(2);
    const auto x = random_double_array(rng, {2, 5}, 0.5f, -2, 2, true);
    const auto positive = random_double_array(rng, {2, 5}, 2.0f, 0.3, 2.0);
    const auto r = random_double_array(rng, {2, 5}, 1.5f);
    check_gradient("neg", [](const array& v) { return neg(v); }, x, r, neg_vjp(r));
    check_gradient("abs", [](const array& v) { return abs(v); }, x, r, abs_vjp(r, x));
    check_gradient("relu", [](const array& v) { return relu(v); }, x, r, relu_vjp(r, x));
    check_gradient("gelu", [](const array& v) { return gelu(v); }, x, r, gelu_vjp(r, x));
    check_gradient("exp", [](const array& v) { return exp(v); }, x, r, exp_vjp(r, exp(x)));
    check_gradient("log", [](const array& v) { return log(v); }, positive, r, log_vjp(r, positive));
    check_gradient("sqrt", [](const array& v) { return sqrt(v); }, positive, r, sqrt_vjp(r, sqrt(positive)));
    check_gradient("transpose", [](const array& v) { return transpose(v); }, x, transpose(r), transpose_vjp(transpose(r)));
    const auto flat = reshape(r, {10});
    check_gradient("reshape", [](const array& v) { return reshape(v, {10}); }, x, flat, reshape_vjp(flat, x.shape()));
    const auto rs = random_double_array(rng, {2}, 1.0f);
    check_gradient("reduce_sum", [](const array& v) { return reduce_sum(v, {1}); }, x, rs, reduce_sum_vjp(rs, x.shape(), {1}));
    const auto y = softmax(x, 1);
    check_gradient("softmax", [](const array& v) { return softmax(v, 1); }, x, r, softmax_vjp(r, y, 1));
    check_gradient("tanh", [](const array& v) { return tanh(v); }, x, r, tanh_vjp(r, x));
    check_gradient("reduce_mean", [](const array& v) { return reduce_mean(v, {1}); }, x, rs, reduce_mean_vjp(rs, x.shape(), {1}));
    const auto ly = log_softmax(x, 1);
    check_gradient("log_softmax", [](const array& v) { return log_softmax(v, 1); }, x, r, log_softmax_vjp(r, ly, 1));
    const auto column = softmax(x, 0);
    check_gradient("softmax along axis 0", [](const array& v) { return softmax(v, 0); }, x, r, softmax_vjp(r, column, 0));
}

TEST_CASE("unit_scaling's backward rules give the same gradients (only the scales differ)", "[backward][unit_scaling]")
{
    using unit = unit_scaling;
    std::mt19937 rng(4);
    const auto x = random_double_array(rng, {2, 5}, 0.5f, -2, 2, true);
    const auto positive = random_double_array(rng, {2, 5}, 2.0f, 0.3, 2.0);
    const auto r = random_double_array(rng, {2, 5}, 1.5f);
    check_gradient("relu", [](const array& v) { return relu(v); }, x, r, relu_vjp<unit>(r, x));
    check_gradient("gelu", [](const array& v) { return gelu(v); }, x, r, gelu_vjp<unit>(r, x));
    check_gradient("tanh", [](const array& v) { return tanh(v); }, x, r, tanh_vjp<unit>(r, x));
    check_gradient("abs", [](const array& v) { return abs(v); }, x, r, abs_vjp<unit>(r, x));
    check_gradient("exp", [](const array& v) { return exp(v); }, x, r, exp_vjp<unit>(r, exp<unit>(x)));
    check_gradient("log", [](const array& v) { return log(v); }, positive, r, log_vjp<unit>(r, positive));
    check_gradient("sqrt", [](const array& v) { return sqrt(v); }, positive, r, sqrt_vjp<unit>(r, sqrt<unit>(positive)));
    check_gradient("softmax", [](const array& v) { return softmax(v, 1); }, x, r, softmax_vjp<unit>(r, softmax<unit>(x, 1), 1));
    check_gradient("log_softmax", [](const array& v) { return log_softmax(v, 1); }, x, r,
                   log_softmax_vjp<unit>(r, log_softmax<unit>(x, 1), 1));
    const auto rs = random_double_array(rng, {2}, 1.0f);
    check_gradient("reduce_mean", [](const array& v) { return reduce_mean(v, {1}); }, x, rs, reduce_mean_vjp<unit>(rs, x.shape(), {1}));

    const auto d = random_double_array(rng, {5}, 3.0f, -2, 2, true);
    const auto c = random_double_array(rng, {1}, 0.25f, -2, 2, true);
    const auto mul_g = mul_vjp<unit>(r, x, d);
    check_gradient("mul a", [&](const array& v) { return mul(v, d); }, x, r, mul_g.first);
    check_gradient("mul b (broadcast)", [&](const array& v) { return mul(x, v); }, d, r, mul_g.second);
    const auto mul_c = mul_vjp<unit>(r, x, c);
    check_gradient("mul by one element", [&](const array& v) { return mul(x, v); }, c, r, mul_c.second);
    const auto add_g = add_vjp<unit>(r, x.shape(), d.shape());
    check_gradient("add b (broadcast)", [&](const array& v) { return add(x, v); }, d, r, add_g.second);
    const auto sub_g = sub_vjp<unit>(r, x.shape(), c.shape());
    check_gradient("sub one element", [&](const array& v) { return sub(x, v); }, c, r, sub_g.second);

    // concatenate: the cotangent's pieces, whatever the parts' scales.
    const auto p1 = random_double_array(rng, {2, 2}, 4.0f), p2 = random_double_array(rng, {2, 3}, 0.125f);
    const auto rc = random_double_array(rng, {2, 5}, 1.0f);
    const auto pieces = concatenate_vjp(rc, {2, 3}, 1);
    check_gradient("concatenate first", [&](const array& v) { return concatenate<unit>({v, p2}, 1); }, p1, rc, pieces[0]);
    check_gradient("concatenate second", [&](const array& v) { return concatenate<unit>({p1, v}, 1); }, p2, rc, pieces[1]);

    // Cross-entropy: the same loss and gradient under both strategies, int32 labels.
    const auto logits = random_double_array(rng, {4, 3}, 2.0f);
    const std::vector<std::int32_t> labels{0, 2, 1, 2};
    const auto ce = softmax_cross_entropy<unit>(logits, labels);
    const xt::xarray<float> g = ce.grad.value();
    const double h = 1e-6;
    for (std::size_t i = 0; i < logits.size(); ++i) {
        xt::xarray<double> plus = logits.value(), minus = logits.value();
        plus.data()[i] += h;
        minus.data()[i] -= h;
        const double numeric = (softmax_cross_entropy(array(plus, 1.0f), labels).loss -
                                softmax_cross_entropy(array(minus, 1.0f), labels).loss) / (2 * h);
        CHECK(std::abs(g.data()[i] - numeric) <= 1e-6);
    }
}

TEST_CASE("softmax cross-entropy: value and gradient", "[backward]")
{
    std::mt19937 rng(3);
    const auto logits = random_double_array(rng, {4, 3}, 2.0f);
    const std::vector<std::uint8_t> labels{0, 2, 1, 2};
    const auto result = softmax_cross_entropy(logits, labels);
    // Hand check of the first row's term is implied by the finite differences of the mean.
    const double h = 1e-6;
    const xt::xarray<float> g = result.grad.value();
    for (std::size_t i = 0; i < logits.size(); ++i) {
        xt::xarray<double> plus = logits.value(), minus = logits.value();
        plus.data()[i] += h;
        minus.data()[i] -= h;
        const double numeric = (softmax_cross_entropy(array(plus, 1.0f), labels).loss -
                                softmax_cross_entropy(array(minus, 1.0f), labels).loss) / (2 * h);
        CHECK(std::abs(g.data()[i] - numeric) <= 1e-6);
    }
    const auto uniform = softmax_cross_entropy(array(xt::zeros<double>({2, 4}), 1.0f), std::vector<std::uint8_t>{1, 3});
    CHECK(uniform.loss == Approx(std::log(4.0)));
    CHECK_THROWS_AS(softmax_cross_entropy(logits, std::vector<std::uint8_t>{0, 1}), shape_error);
    CHECK_THROWS_WITH(softmax_cross_entropy(logits, std::vector<std::uint8_t>{0, 1, 2, 3}), Catch::Matchers::Contains("label 3 out of range for 3 classes"));
}
