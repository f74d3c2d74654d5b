// A user-sized training program, the compile-time probe: the two-layer MLP of docs/autodiff.md,
// trained with ad::value_and_grad and ad::sgd in float32 and under the fp8 recipe (E4M3 forward,
// E5M2 gradients). compile_time.sh measures how long this TU takes to compile.
#include <scalify/scalify.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <random>

using namespace scalify;
using array = ScaledArray<float, pow2_scale>;

template <class A>
struct mlp {
    A w1, b1, w2, b2;
    template <class F>
    friend void for_each_parameter(mlp& self, F&& f)
    {
        f(self.w1), f(self.b1), f(self.w2), f(self.b2);
    }
};

template <class Params, class X>
auto forward(const Params& p, const X& x)
{
    const auto h = relu(matmul(x, p.w1) + p.b1);
    return matmul(h, p.w2) + p.b2;
}

array normal(std::mt19937& rng, std::vector<std::size_t> shape, float stddev)
{
    std::normal_distribution<float> dist(0.0f, stddev);
    xt::xarray<float> data = xt::xarray<float>::from_shape(shape);
    for (auto& v : data) v = dist(rng);
    return as_scaled_array<pow2_scale>(std::move(data));
}

/// A toy task: the class is the index of the largest of the first four inputs.
std::vector<std::size_t> labels_of(const array& x)
{
    std::vector<std::size_t> labels(x.shape()[0]);
    const auto value = x.value();
    for (std::size_t i = 0; i < labels.size(); ++i) {
        std::size_t best = 0;
        for (std::size_t j = 1; j < 4; ++j) {
            if (value(i, j) > value(i, best)) best = j;
        }
        labels[i] = best;
    }
    return labels;
}

double train(mlp<array>& params, const array& x, const std::vector<std::size_t>& labels, int steps)
{
    double last = 0.0;
    for (int step = 0; step < steps; ++step) {
        auto [loss, grads] = ad::value_and_grad<unit_scaling>(
            [&](const auto& p) { return softmax_cross_entropy(dynamic_rescale_l2_grad(forward(p, x)), labels); }, params);
        ad::sgd(0.05).step(params, grads);
        last = double(loss.value()());
    }
    return last;
}

std::size_t correct(const mlp<array>& params, const array& x, const std::vector<std::size_t>& labels)
{
    const auto logits = forward(params, x).value();
    std::size_t hits = 0;
    for (std::size_t i = 0; i < labels.size(); ++i) {
        std::size_t best = 0;
        for (std::size_t j = 1; j < 4; ++j) {
            if (logits(i, j) > logits(i, best)) best = j;
        }
        hits += best == labels[i];
    }
    return hits;
}

int main()
{
    std::mt19937 rng(7);
    const array x = normal(rng, {256, 32}, 1.0f);
    const auto labels = labels_of(x);
    const mlp<array> init{normal(rng, {32, 64}, 0.18f), normal(rng, {64}, 0.0f), normal(rng, {64, 4}, 0.13f),
                          normal(rng, {4}, 0.0f)};

    mlp<array> fp32 = init;
    const double loss32 = train(fp32, x, labels, 50);
    fmt::print("float32: loss {:.3f}, {} of {} right\n", loss32, correct(fp32, x, labels), labels.size());

    mlp<array> fp8 = init;
    double loss8 = 0.0;
    {
        const ad::matmul_precision_scope recipe(dtype::float8_e4m3fn, dtype::float8_e5m2);
        loss8 = train(fp8, x, labels, 50);
    }
    fmt::print("fp8 recipe: loss {:.3f}, {} of {} right\n", loss8, correct(fp8, x, labels), labels.size());
}
