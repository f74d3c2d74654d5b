// First, quantising one tensor: quantize<T> picks the scale from the data's amax, where a cast at
// scale 1 (as_scaled_array) leaves small values in fp8's subnormals. Then why scale: a chain of 16 matmuls with N(0,1) 256x256 fp8 (E4M3) weights and a unit-variance
// input. Each layer multiplies the magnitude by sqrt(256) = 16. Kept at scale 1 the fp8 data
// overflow within a few layers; with the default scaling strategy the scale absorbs the growth
// (2^4 per layer, exactly, under pow2_scale) and the data stay unit-variance and accurate.
#include <scalify/scalify.hpp>

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <vector>

using namespace scalify;
using fp8_array = ScaledArray<float8_e4m3fn, pow2_scale>;

namespace {

/// Relative RMS difference of a scaled result from a float64 reference.
double relative_rms(const fp8_array& got, const std::vector<double>& want)
{
    const xt::xarray<float> value = got.value();
    double num = 0, den = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        const double d = value.data()[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    return std::sqrt(num / den);
}

/// Share of elements that are NaN (e4m3fn has no infinity: overflow without saturation is NaN).
double nan_share(const fp8_array& a)
{
    std::size_t count = 0;
    for (const auto& x : a.data()) count += isnan(x) ? 1 : 0;
    return static_cast<double>(count) / static_cast<double>(a.size());
}

}  // namespace

/// Relative RMS error of a quantised array's values against x.
double round_trip_error(const xt::xarray<float>& x, const xt::xarray<float>& back)
{
    double num = 0, den = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double d = double(back.data()[i]) - double(x.data()[i]);
        num += d * d;
        den += double(x.data()[i]) * double(x.data()[i]);
    }
    return std::sqrt(num / den);
}

void quantise_one_tensor()
{
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    xt::xarray<float> x = xt::xarray<float>::from_shape({1'000'000});
    for (auto& e : x) e = normal(rng);
    const auto q = quantize<float8_e4m3fn>(x);  // pow2 scale from the amax, nearest-even, satfinite
    const auto f = quantize<float8_e4m3fn, float_scale>(x);
    const auto unscaled = cast<float8_e4m3fn>(as_scaled_array<pow2_scale>(x));  // scale 1
    fmt::print("== N(0,1) x 1e-3, 10^6 elements, to float8_e4m3fn and back: relative RMS error\n");
    fmt::print("quantize<float8_e4m3fn>(x)              scale 2^{:<6} {:.3f}\n", std::ilogb(q.scale()),
               round_trip_error(x, q.value()));
    fmt::print("quantize<float8_e4m3fn, float_scale>(x) scale {:<8.2e} {:.3f}\n", f.scale(), round_trip_error(x, f.value()));
    fmt::print("cast of as_scaled_array(x)              scale 1        {:.3f}\n\n", round_trip_error(x, unscaled.value()));
}

int main()
{
    quantise_one_tensor();
    constexpr std::size_t width = 256, batch = 16, depth = 16;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto random_fp8 = [&](std::size_t rows, std::size_t cols) {
        xt::xarray<float> x = xt::xarray<float>::from_shape({rows, cols});
        for (auto& e : x) e = normal(rng);
        return cast<float8_e4m3fn>(as_scaled_array<pow2_scale>(x));  // scale 1, data rounded to fp8
    };
    std::vector<fp8_array> weights;
    for (std::size_t l = 0; l < depth; ++l) weights.push_back(random_fp8(width, width));
    const fp8_array input = random_fp8(batch, width);

    // float64 reference on the same fp8 weights and input.
    const xt::xarray<float> input_value = input.value();
    std::vector<double> reference(input_value.begin(), input_value.end());
    for (const auto& w : weights) {
        const xt::xarray<float> wv = w.value();
        std::vector<double> next(batch * width, 0.0);
        for (std::size_t i = 0; i < batch; ++i)
            for (std::size_t k = 0; k < width; ++k)
                for (std::size_t j = 0; j < width; ++j) next[i * width + j] += reference[i * width + k] * wv(k, j);
        reference = std::move(next);
    }

    fmt::print("layer | unscaled fp8: NaN share | scaled fp8: scale, max |data|\n");
    fp8_array unscaled = input, scaled = input;
    for (std::size_t l = 0; l < depth; ++l) {
        unscaled = matmul<natural_scaling, float8_e4m3fn>(unscaled, weights[l]);  // scale stays 1
        scaled = matmul(scaled, weights[l]);                                       // default_scaling
        float amax = 0;
        for (const auto& x : scaled.data()) amax = std::max(amax, std::abs(static_cast<float>(x)));
        fmt::print("{:5} | {:22.0f}% | 2^{:<3} {:6.1f}\n", l + 1, 100 * nan_share(unscaled),
                   std::ilogb(scaled.scale()), amax);
    }
    const double error = relative_rms(scaled, reference);
    fmt::print("scaled fp8 chain vs float64: relative RMS error {:.2f} ({})\n", error,
               error < 0.15 ? "within the 15% target" : "OUTSIDE the 15% target");
    fmt::print("unscaled fp8 chain: {:.0f}% NaN after {} layers\n", 100 * nan_share(unscaled), depth);
    return error < 0.15 ? 0 : 1;
}
