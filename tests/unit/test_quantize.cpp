// quantize<T> / dequantize: the per-tensor amax quantiser and its block layouts.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

using namespace scalify;

namespace {

xt::xarray<float> normal_data(std::size_t n, float stddev, unsigned seed = 11)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, stddev);
    xt::xarray<float> x = xt::xarray<float>::from_shape({n});
    for (auto& v : x) v = normal(rng);
    return x;
}

/// Bit-identical arrays of equal shape (NaN-free data).
template <class A, class B>
bool same(const A& a, const B& b)
{
    return a == b;
}

double relative_rms_error(const xt::xarray<float>& approx, const xt::xarray<float>& exact)
{
    double error = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < exact.size(); ++i) {
        const double d = double(approx.data()[i]) - double(exact.data()[i]);
        error += d * d;
        norm += double(exact.data()[i]) * double(exact.data()[i]);
    }
    return std::sqrt(error / norm);
}

}  // namespace

TEST_CASE("quantize: N(0,1) x 1e-3 data round-trip within 3 % in e4m3fn, as README shows", "[quantize]")
{
    const auto x = normal_data(1'000'000, 1e-3f);
    const auto q = quantize<float8_e4m3fn>(x);
    const double error = relative_rms_error(dequantize(q).data(), x);
    INFO("relative RMS error " << error << ", scale " << q.scale());
    CHECK(error <= 0.03);
    // The unscaled cast README used to teach loses most of the signal to e4m3's subnormals.
    const double unscaled = relative_rms_error(cast<float8_e4m3fn>(as_scaled_array<pow2_scale>(x)).value(), x);
    CHECK(unscaled > 0.5);
    // A float scale maps the amax to 448 exactly.
    const double float_error = relative_rms_error(dequantize(quantize<float8_e4m3fn, float_scale>(x)).data(), x);
    CHECK(float_error <= 0.03);
}

TEST_CASE("quantize: the pow2 scale fills T's range without saturating", "[quantize]")
{
    const auto x = normal_data(4096, 3.0f);
    const float amax = xt::amax(xt::abs(x))();
    const auto q = quantize<float8_e4m3fn>(x);
    CHECK(is_pow2_or_zero(q.scale()));
    const float data_amax = xt::amax(xt::abs(cast<float>(q).data()))();
    CHECK(data_amax <= 448.0f);
    CHECK(data_amax > 224.0f * (1.0f - 1.0f / 16.0f));  // within e4m3's rounding of the top binade
    // float_scale: the multiplier is 448 / amax exactly as current_scaling's.
    const auto f = quantize<float8_e4m3fn, float_scale>(x);
    CHECK(f.scale() == 1.0f / (448.0f / amax));
    CHECK(same(f.data(), current_scaling<float8_e4m3fn>{}.quantize(x).data()));
    CHECK(same(q.data(), current_scaling<float8_e4m3fn>{}.quantize<pow2_scale>(x).data()));
}

TEST_CASE("quantize: NaN and inf do not decide the scale; they stay non-finite or saturate", "[quantize]")
{
    auto x = normal_data(1000, 1e-3f);
    const auto clean = quantize<float8_e4m3fn>(x);
    x(3) = std::numeric_limits<float>::quiet_NaN();
    x(5) = std::numeric_limits<float>::infinity();
    x(7) = -std::numeric_limits<float>::infinity();
    const auto q = quantize<float8_e4m3fn>(x);
    CHECK(q.scale() == clean.scale());
    const auto v = dequantize(q).data();
    CHECK(std::isnan(v(3)));
    CHECK(v(5) == 448.0f * q.scale());  // saturate_finite: inf -> max
    CHECK(v(7) == -448.0f * q.scale());
    CHECK(relative_rms_error(xt::xarray<float>(xt::view(v, xt::range(10, 1000))),
                             xt::xarray<float>(xt::view(x, xt::range(10, 1000)))) <= 0.04);
    // no_saturation: inf where the format has one, NaN where it has none.
    const auto e5 = dequantize(quantize<float8_e5m2, pow2_scale, round_nearest_even, no_saturation>(x)).data();
    CHECK(std::isinf(e5(5)));
    CHECK(e5(7) < 0.0f);
    const auto e4 = dequantize(quantize<float8_e4m3fn, pow2_scale, round_nearest_even, no_saturation>(x)).data();
    CHECK(std::isnan(e4(5)));
}

TEST_CASE("quantize: no finite non-zero element gives scale 1", "[quantize]")
{
    const xt::xarray<float> zeros = xt::zeros<float>({8});
    const auto q = quantize<float8_e4m3fn>(zeros);
    CHECK(q.scale() == 1.0f);
    CHECK(xt::all(xt::equal(dequantize(q).data(), 0.0f)));
    const xt::xarray<float> nans = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
    const auto n = quantize<float8_e5m2>(nans);
    CHECK(n.scale() == 1.0f);
    const xt::xarray<float> empty = xt::xarray<float>::from_shape({0});
    CHECK(quantize<float8_e4m3fn>(empty).scale() == 1.0f);
    // A tiny amax (subnormal float) would need a multiplier beyond float32: clamped, still finite.
    const xt::xarray<float> tiny = {1e-44f, -1e-45f};
    const auto t = quantize<float8_e4m3fn>(tiny);
    CHECK(std::isfinite(t.scale()));
    CHECK(t.scale() > 0.0f);
}

TEST_CASE("quantize: stochastic rounding depends on the seed only, and is unbiased", "[quantize]")
{
    const auto x = normal_data(1 << 16, 1.0f, 3);
    const auto a = quantize<float8_e5m2, pow2_scale, round_stochastic>(x, 42);
    const auto b = quantize<float8_e5m2, pow2_scale, round_stochastic>(x, 42);
    const auto c = quantize<float8_e5m2, pow2_scale, round_stochastic>(x, 43);
    CHECK(same(a.data(), b.data()));
    CHECK_FALSE(same(a.data(), c.data()));
    const double bias = xt::mean(dequantize(a).data() - x)();
    CHECK(std::abs(bias) < 1e-3);
}

TEST_CASE("quantize: from a scaled array, and into 16-bit types", "[quantize]")
{
    const auto x = normal_data(2048, 50.0f);
    const auto q8 = quantize<float8_e4m3fn, float_scale>(as_scaled_array(x));
    CHECK(same(q8.data(), quantize<float8_e4m3fn, float_scale>(x).data()));
    const auto e5 = quantize<float8_e5m2>(q8);  // re-quantised from its values
    CHECK(relative_rms_error(dequantize(e5).data(), x) < 0.1);
    const auto h = quantize<Eigen::half>(x);
    CHECK(relative_rms_error(dequantize(h).data(), x) < 1e-3);
    const auto bf = quantize<Eigen::bfloat16>(x);
    CHECK(relative_rms_error(dequantize(bf).data(), x) < 5e-3);
    CHECK(is_pow2_or_zero(bf.scale()));
}

TEST_CASE("quantize: block layouts are the block quantisers", "[quantize][block]")
{
    xt::xarray<float> x = xt::reshape_view(normal_data(64 * 96, 1.0f, 5), {64, 96});
    const auto mx = quantize<float8_e4m3fn>(x, mx_blocks{.axis = 1});
    CHECK(same(mx.data(), quantize_mx<float8_e4m3fn>(x, 1).data()));
    CHECK(same(dequantize(mx).data(), quantize_mx<float8_e4m3fn>(x, 1).value()));
    const auto ceil = quantize<float8_e4m3fn>(x, mx_blocks{.axis = 0, .size = 16, .rule = mx_scale_rule::ceil});
    CHECK(same(ceil.value(), quantize_mx<float8_e4m3fn>(x, 0, 16, mx_scale_rule::ceil).value()));
    const auto blocks = quantize<float8_e4m3fn>(x, per_block{1, 32});
    CHECK(same(blocks.value(), quantize_blocks<float8_e4m3fn>(x, 1, 32).value()));
    const auto rows = quantize<float8_e5m2>(x, per_axis{1});
    CHECK(same(rows.value(), quantize_axiswise<float8_e5m2>(x, 1).value()));
    CHECK_THROWS_AS(quantize<float8_e4m3fn>(x, per_axis{2}), shape_error);
}

TEST_CASE("current_scaling: an inf element no longer makes the scale infinite", "[quantize][amax_scaling]")
{
    auto x = normal_data(256, 2.0f);
    const auto clean = current_scaling<float8_e4m3fn>{}.quantize(x);
    x(0) = std::numeric_limits<float>::infinity();
    const auto q = current_scaling<float8_e4m3fn>{}.quantize(x);
    CHECK(q.scale() == clean.scale());
    CHECK(q.value()(0) == 448.0f * q.scale());
}
