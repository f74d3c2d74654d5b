// libFuzzer target: scalar and bulk conversion of arbitrary bit patterns in every format and
// mode. Checked properties, not just "no crash": codes round-trip through float; deterministic
// rounding is monotonic; bulk equals scalar; fake_quantize_n equals decode(encode); stochastic
// rounding lands on one of the two neighbours; double and float sources agree on float inputs;
// quantize<T> of the inputs as an array picks a valid scale from the finite elements alone, never
// saturates a finite element under pow2_scale, and stores convert(x * (1 / scale)) element-wise.
#include <scalify/scalify.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

namespace fuzz_convert {

using namespace scalify;

namespace {

[[noreturn]] void fail(const char* what, std::uint32_t input, unsigned got, unsigned want)
{
    std::fprintf(stderr, "property violated: %s, input 0x%08x: got 0x%x, expected 0x%x\n", what, input, got, want);
    std::abort();
}

template <class T, class Rounding, class Saturation>
void check_deterministic(const std::vector<float>& in)
{
    std::vector<T> bulk(in.size());
    convert_n<T, Rounding, Saturation>(std::span<const float>(in), std::span<T>(bulk));
    for (std::size_t i = 0; i < in.size(); ++i) {
        const T one = convert<T, Rounding, Saturation>(in[i]);
        const auto bits = std::bit_cast<std::uint32_t>(in[i]);
        if (one.bits() != bulk[i].bits()) fail("bulk == scalar", bits, bulk[i].bits(), one.bits());
        // e8m0fnu from float follows ml_dtypes' table, which rounds float-subnormal inputs above
        // 2^-127 up to 2^-126; from double the rounding is exact (docs/formats.md).
        const bool e8m0_float_subnormal = !T::format::has_zero && std::fpclassify(in[i]) == FP_SUBNORMAL;
        if (!e8m0_float_subnormal && convert<T, Rounding, Saturation>(static_cast<double>(in[i])).bits() != one.bits())
            fail("double source == float source", bits, convert<T, Rounding, Saturation>(static_cast<double>(in[i])).bits(), one.bits());
    }
    if constexpr (T::format::has_zero) {
        std::vector<float> fake(in.size());
        fake_quantize_n<T, Rounding, Saturation>(std::span<const float>(in), std::span<float>(fake));
        for (std::size_t i = 0; i < in.size(); ++i) {
            const auto want = std::bit_cast<std::uint32_t>(static_cast<float>(bulk[i]));
            if (std::bit_cast<std::uint32_t>(fake[i]) != want) fail("fake_quantize == decode(encode)", std::bit_cast<std::uint32_t>(in[i]), std::bit_cast<std::uint32_t>(fake[i]), want);
        }
    }
    // Monotonic: x <= y implies q(x) <= q(y) as values (both non-NaN).
    for (std::size_t i = 0; i + 1 < in.size(); ++i) {
        const float x = in[i], y = in[i + 1];
        if (std::isnan(x) || std::isnan(y)) continue;
        const float qx = static_cast<float>(bulk[i]), qy = static_cast<float>(bulk[i + 1]);
        if (std::isnan(qx) || std::isnan(qy)) continue;
        if ((x <= y && qx > qy) || (y <= x && qy > qx)) fail("monotonic", std::bit_cast<std::uint32_t>(x), bulk[i].bits(), bulk[i + 1].bits());
    }
}

template <class T>
void check_format(const std::vector<float>& in, const std::uint8_t* codes, std::size_t code_count, std::uint32_t random)
{
    using F = typename T::format;
    check_deterministic<T, round_nearest_even, no_saturation>(in);
    check_deterministic<T, round_nearest_even, saturate_finite>(in);
    check_deterministic<T, round_toward_zero, no_saturation>(in);
    check_deterministic<T, round_toward_zero, saturate_finite>(in);
    // Every code's value converts back to the same code (NaN codes: to a NaN).
    for (std::size_t i = 0; i < code_count; ++i) {
        const auto code = static_cast<typename F::storage_type>(codes[i] & ((1u << F::total_bits) - 1));
        const T t = T::from_bits(code);
        const T back = convert<T>(static_cast<float>(t));
        if (isnan(t) ? !isnan(back) : back.bits() != t.bits()) fail("code round trip", code, back.bits(), t.bits());
    }
    // Stochastic rounding: the truncated value or the next code away from zero (none past max).
    for (const float x : in) {
        const T s = convert<T, round_stochastic, saturate_finite>(x, random);
        const T down = convert<T, round_toward_zero, saturate_finite>(x);
        random = random * 1664525u + 1013904223u;
        if (std::isnan(x) || s.bits() == down.bits()) continue;
        const unsigned magnitude = down.bits() & F::magnitude_mask;
        const unsigned sign = std::signbit(x) ? F::sign_mask : 0u;
        if (magnitude >= F::max_magnitude || s.bits() != (sign | (magnitude + 1)))
            fail("stochastic neighbour", std::bit_cast<std::uint32_t>(x), s.bits(), sign | (magnitude + 1));
    }
}

template <class T, class Policy>
void check_quantize(const std::vector<float>& in)
{
    xt::xarray<float> x = xt::xarray<float>::from_shape({in.size()});
    std::copy(in.begin(), in.end(), x.begin());
    const auto q = quantize<T, Policy>(x);
    const float scale = q.scale();
    const auto scale_bits = std::bit_cast<std::uint32_t>(scale);
    if (!(scale > 0.0f) || !std::isfinite(scale)) fail("quantize: scale finite and > 0", scale_bits, 0, 0);
    if (Policy::power_of_two && !is_pow2_or_zero(scale)) fail("quantize: pow2 scale", scale_bits, 0, 0);
    float amax = 0.0f;
    for (const float v : in) amax = std::isfinite(v) ? std::max(amax, std::abs(v)) : amax;
    // q = max(T) / amax (the largest power of two below it under pow2_scale), clamped to 2^127;
    // the scale is 1 / q, which does not give q back exactly under float_scale.
    float multiplier = 1.0f;
    if (amax > 0.0f) {
        const double exact = static_cast<double>(std::numeric_limits<T>::max()) / static_cast<double>(amax);
        multiplier = exact < 0x1p127 ? static_cast<float>(exact) : 0x1p127f;
        if (Policy::power_of_two) multiplier = pow2_round_down(multiplier);
    }
    if (scale != 1.0f / multiplier) fail("quantize: scale == 1 / q", scale_bits, 0, std::bit_cast<std::uint32_t>(1.0f / multiplier));
    for (std::size_t i = 0; i < in.size(); ++i) {
        const auto input = std::bit_cast<std::uint32_t>(in[i]);
        const T want = convert<T, round_nearest_even, saturate_finite>(in[i] * multiplier);
        const T got = q.data()(i);
        if (isnan(want) ? !isnan(got) : got.bits() != want.bits()) fail("quantize == convert(x * q)", input, got.bits(), want.bits());
        // Under pow2_scale the multiplier rounds down: no finite element reaches past max(T).
        if (Policy::power_of_two && std::isfinite(in[i]) &&
            std::abs(static_cast<double>(in[i]) * multiplier) > static_cast<double>(std::numeric_limits<T>::max()) * (1.0 + 1e-6))
            fail("quantize: pow2 multiplier does not saturate", input, got.bits(), 0);
    }
}

}  // namespace

/// The target's body; fuzz_convert's LLVMFuzzerTestOneInput (generated) calls it.
int test_one_input(const std::uint8_t* data, std::size_t size)
{
    std::vector<float> in(size / 4);
    for (std::size_t i = 0; i < in.size(); ++i) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, data + 4 * i, 4);
        in[i] = std::bit_cast<float>(bits);
    }
    const std::uint32_t random = size >= 4 ? std::bit_cast<std::uint32_t>(in.empty() ? 0.0f : in.back()) : 0x9e3779b9u;
    check_format<float8_e4m3fn>(in, data, size, random);
    check_format<float8_e5m2>(in, data, size, random);
    check_format<float8_e4m3fnuz>(in, data, size, random);
    check_format<float8_e5m2fnuz>(in, data, size, random);
    check_format<float8_e4m3b11fnuz>(in, data, size, random);
    check_format<float8_e3m4>(in, data, size, random);
    check_format<float8_e4m3>(in, data, size, random);
    check_format<float8_e8m0fnu>(in, data, size, random);
    check_format<float6_e2m3fn>(in, data, size, random);
    check_format<float6_e3m2fn>(in, data, size, random);
    check_format<float4_e2m1fn>(in, data, size, random);
    check_quantize<float8_e4m3fn, pow2_scale>(in);
    check_quantize<float8_e4m3fn, float_scale>(in);
    check_quantize<float8_e5m2, pow2_scale>(in);
    check_quantize<float4_e2m1fn, pow2_scale>(in);
    return 0;
}

}  // namespace fuzz_convert
