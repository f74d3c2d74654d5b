// A model written once, differentiated in scaled arithmetic: the same two-layer regression runs
// on plain ScaledArrays (inference) and under ad::value_and_grad in float32 and in an
// E4M3-forward / E5M2-gradient recipe. With a loss weight of 2^-24 the scaled fp8 gradients keep
// unit-RMS data (the weight sits in their scales) and stay as accurate as at weight 1, with no
// loss scaler; the same casts at scale 1 (plain fp8) flush every gradient to zero.
#include <scalify/scalify.hpp>

#include <fmt/format.h>

#include <cmath>
#include <random>

using namespace scalify;
using array = ScaledArray<float, pow2_scale>;

template <class A>
struct regression {
    A w1, w2;
    template <class F>
    friend void for_each_parameter(regression& self, F&& f)
    {
        f(self.w1), f(self.w2);
    }
};

/// The model and its loss, written once for ScaledArrays and ad::vars.
template <class Params, class X>
auto predict(const Params& p, const X& x)
{
    return matmul(gelu(matmul(x, p.w1)), p.w2);
}
template <class Params, class X>
auto loss(const Params& p, const X& x, const X& target, double weight)
{
    const auto error = predict(p, x) - target;
    return reduce_sum(error * error) * weight;
}

array normal(std::mt19937& rng, std::size_t rows, std::size_t cols, float stddev)
{
    std::normal_distribution<float> dist(0.0f, stddev);
    xt::xarray<float> data = xt::xarray<float>::from_shape({rows, cols});
    for (auto& v : data) v = dist(rng);
    return as_scaled_array<pow2_scale>(std::move(data));
}

double relative_rms(const xt::xarray<float>& x, const xt::xarray<float>& reference)
{
    return std::sqrt(double(xt::sum(xt::square(x - reference))()) / double(xt::sum(xt::square(reference))()));
}

int main()
{
    std::mt19937 rng(42);
    const array x = normal(rng, 64, 32, 1.0f), target = normal(rng, 64, 8, 1.0f);
    // Parameters at unit-RMS data, the magnitude in the scale (as unit scaling stores them).
    const regression<array> params{dynamic_rescale_l2(normal(rng, 32, 16, 0.18f)), dynamic_rescale_l2(normal(rng, 16, 8, 0.25f))};

    fmt::print("inference on plain ScaledArrays: loss {:.4f}\n", loss(params, x, target, 1.0).value()());

    const auto objective = [&](double weight) {
        return [&x, &target, weight](const auto& p) { return loss(p, x, target, weight); };
    };
    const auto reference = ad::grad<unit_scaling>(objective(1.0), params);

    fmt::print("\nrecipe        loss weight  grad w1: type      scale   data RMS      zeros  rel. error vs float32\n");
    const auto report = [&](const char* recipe, const char* weight_text, double weight, const auto& grads) {
        const auto g = grads.w1.template as<float>();
        const double data_rms = std::sqrt(double(xt::mean(xt::square(g.data()))()));
        const double zeros = double(xt::sum(xt::equal(grads.w1.value(), 0.0f))()) / double(g.size());
        const xt::xarray<float> unweighted = grads.w1.value() / static_cast<float>(weight);
        fmt::print("{:<13} {:<12} {:<14} {:>8.2g}  {:>8.3f}  {:>9.0f}%  {:.4f}\n", recipe, weight_text, grads.w1.type_name(),
                   grads.w1.scale(), data_rms, 100 * zeros, relative_rms(unweighted, reference.w1.value()));
    };
    report("float32", "1", 1.0, reference);
    for (const auto& [text, weight] : {std::pair{"1", 1.0}, std::pair{"2^-24", std::ldexp(1.0, -24)}}) {
        const ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
        report("scaled fp8", text, weight, ad::grad<unit_scaling>(objective(weight), params));
    }
    for (const auto& [text, weight] : {std::pair{"1", 1.0}, std::pair{"2^-24", std::ldexp(1.0, -24)}}) {
        const ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2, ad::cast_scaling::unscaled);
        report("plain fp8", text, weight, ad::grad<unit_scaling>(objective(weight), params));
    }
}
