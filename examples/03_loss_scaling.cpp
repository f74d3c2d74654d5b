// Loss scaling rescues an fp16 backward pass that underflows. A linear layer's weight gradient
// x^T . dy is computed in fp16 (float32 accumulation, fp16 storage) from a tiny loss gradient
// (loss weight 2^-28, as when a loss is averaged over many tokens). Unscaled, most gradients
// flush to zero; the loss scaler, starting at 1 and growing 16x after each clean step, pushes dy up
// until an overflow makes it back off, and the unscaled gradients come back exact to fp16 rounding.
#include <scalify/scalify.hpp>

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <vector>

using namespace scalify;
using half_array = ScaledArray<Eigen::half, float_scale>;

namespace {

double relative_rms(const xt::xarray<float>& got, const xt::xarray<double>& want)
{
    double num = 0, den = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        num += (got.data()[i] - want.data()[i]) * (got.data()[i] - want.data()[i]);
        den += want.data()[i] * want.data()[i];
    }
    return std::sqrt(num / den);
}

double zero_share(const half_array& a)
{
    std::size_t zeros = 0;
    for (const auto& x : a.data()) zeros += static_cast<float>(x) == 0.0f ? 1 : 0;
    return static_cast<double>(zeros) / static_cast<double>(a.size());
}

}  // namespace

int main()
{
    constexpr std::size_t batch = 64, in = 32, out = 16;
    const double loss_weight = std::ldexp(1.0, -28);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    xt::xarray<float> x = xt::xarray<float>::from_shape({batch, in});
    xt::xarray<float> dy = xt::xarray<float>::from_shape({batch, out});  // d(loss)/dy before the weight
    for (auto& e : x) e = normal(rng);
    for (auto& e : dy) e = normal(rng) / static_cast<float>(batch);

    // float64 reference of the weight gradient x^T . (dy * loss_weight).
    xt::xarray<double> reference = xt::zeros<double>({in, out});
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t i = 0; i < in; ++i)
            for (std::size_t j = 0; j < out; ++j) reference(i, j) += double(x(b, i)) * double(dy(b, j)) * loss_weight;

    const half_array xt_half = transpose(cast<Eigen::half>(as_scaled_array(x)));
    // The backward pass in fp16: dy * loss_weight * loss_scale is what fp16 has to hold.
    const auto backward = [&](float loss_scale) {
        xt::xarray<float> scaled_dy = dy * static_cast<float>(loss_weight * loss_scale);
        const half_array dy_half = cast<Eigen::half>(as_scaled_array(scaled_dy));
        return matmul<natural_scaling, Eigen::half>(xt_half, dy_half);  // fp16 result, scale 1
    };

    const half_array unscaled = backward(1.0f);
    fmt::print("unscaled fp16 gradient: {:.0f}% flushed to zero, relative RMS error {:.3f}\n",
               100 * zero_share(unscaled), relative_rms(unscaled.value(), reference));
    fmt::print("diagnostics of the float32 dy against fp16: {}\n",
               tensor_stats<Eigen::half>(as_scaled_array(xt::xarray<float>(dy * static_cast<float>(loss_weight))), "dy"));

    loss_scaler scaler({.init_scale = 1.0f, .growth_factor = 16.0f, .backoff_factor = 0.25f, .growth_interval = 1});
    fmt::print("\nstep | loss scale | found inf | grads zero | rel. error vs float64\n");
    double last_error = 1.0;
    for (int step = 1; step <= 16; ++step) {
        const float loss_scale = scaler.scale();
        half_array grad = backward(loss_scale);
        const double zeros = zero_share(grad);
        const bool found_inf = scaler.unscale(grad);  // grad's scale becomes 1 / loss_scale
        const double error = found_inf ? std::nan("") : relative_rms(grad.value(), reference);
        fmt::print("{:4} | {:10} | {:9} | {:9.0f}% | {}\n", step, fmt::format("2^{}", std::ilogb(loss_scale)),
                   found_inf ? "yes" : "no", 100 * zeros, found_inf ? std::string("(step skipped)") : fmt::format("{:.4f}", error));
        if (!found_inf) last_error = error;
        scaler.update();
    }
    fmt::print("\nfinal loss scale 2^{}; last clean gradient error {:.4f} ({})\n", std::ilogb(scaler.scale()), last_error,
               last_error < 1e-3 ? "fp16 rounding level" : "NOT rescued");
    return last_error < 1e-3 ? 0 : 1;
}
