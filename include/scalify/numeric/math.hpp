#pragma once
/// \file math.hpp
/// exp and erf of float that give the same bits on every CPU and under any -ffp-contract or
/// -march: scalify::math::exp(float) within 1 ulp of the exact value (0.95 the largest error over
/// all 2^32 float32 inputs) and scalify::math::erf(float) within 2 ulp (1.34 the largest);
/// tests/unit/test_math.cpp keeps a sweep and the exact bits of a few results. They replace libm's
/// expf and erff in GELU, exp and softmax (docs/ops.md): glibc's differ between versions and CPUs,
/// are calls that keep a loop scalar, and take longer paths for larger inputs.
///
///     for (std::size_t i = 0; i < n; ++i) y[i] = scalify::math::erf(x[i]);   // vectorised: g++ -O3, clang -O2
///
/// How the bits stay the same: branch-free code of IEEE +, -, *, / (each correctly rounded on
/// every target), comparisons and integer bit operations (selects too: detail::bit_select), so a
/// vectorised loop computes exactly what the scalar code does. Every product goes through
/// detail::rounded_product (a * b + 0.0f): a compiler that contracts a*b + c into a fused
/// multiply-add (GCC's default where the target has FMA, clang's -ffp-contract=fast; GCC ignores
/// `#pragma STDC FP_CONTRACT`, clang's =fast overrides it) can only fuse the + 0.0f, which gives
/// round(a*b) again (checked: the same bits with and without the guard's adds where no FMA
/// exists, and other bits without them under -march=x86-64-v3 -ffp-contract=fast). What the
/// guarantee does not survive: -ffast-math and its parts (-fassociative-math, -fno-signed-zeros,
/// -freciprocal-math), x87 excess precision (-mfpmath=387), and a flush-to-zero FP mode
/// (subnormal results then flush).
///
/// The double overloads are std::exp and std::erf (libm): scalify's double paths are not hot.

#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>

/// 1 where a compiler may fuse a*b + c into a fused multiply-add, and detail::rounded_product then
/// adds its + 0; 0 on x86-64 compiled without FMA (-march=x86-64 to x86-64-v2, no -mfma): no FMA
/// instruction to fuse into, and the adds cost (SSE2: erf 4.5 -> 3.1 ns an element). Define it 1
/// where these functions inline into a function of its own `target("fma")` attribute; define it 0
/// where every file that includes scalify is compiled with -ffp-contract=off (nothing may fuse
/// then; the repository's own targets do: erf 2.2 -> 1.35 ns an element in AVX2 lanes, Xeon).
#ifndef SCALIFY_MATH_FMA_GUARD
#if defined(__x86_64__) && !defined(__FMA__) && !defined(__FMA4__)
#define SCALIFY_MATH_FMA_GUARD 0
#else
#define SCALIFY_MATH_FMA_GUARD 1
#endif
#endif

namespace scalify {

namespace detail {

/// a * b rounded once, even where the compiler fuses a multiply into the add that follows it: the
/// only add here is + 0, and fma(a, b, +0) == round(a * b) (both give +0 for a -0 product).
template <class V>
    requires(std::same_as<V, float> || std::same_as<V, double>)
[[nodiscard, gnu::always_inline]] constexpr V rounded_product(V a, V b) noexcept
{
    if constexpr (SCALIFY_MATH_FMA_GUARD != 0) {
        return a * b + V(0);
    } else {
        return a * b;
    }
}

/// condition ? a : b through bit masks, for float or double: GCC 12 if-converts a ternary on
/// floats only where no branch holds a floating-point operation that may trap, and after inlining
/// it often cannot (jump threading copies the exp reduction into a clamped branch; a loop body too
/// large to unswitch keeps the branch of a loop-invariant test), so the loop stays scalar.
template <class V>
    requires(std::same_as<V, float> || std::same_as<V, double>)
[[nodiscard, gnu::always_inline]] constexpr V bit_select(bool condition, V a, V b) noexcept
{
    using bits = std::conditional_t<std::same_as<V, float>, std::uint32_t, std::uint64_t>;
    const bits mask = bits{0} - bits{condition};
    return std::bit_cast<V>((std::bit_cast<bits>(a) & mask) | (std::bit_cast<bits>(b) & ~mask));
}

/// c0 x^n + c1 x^(n-1) + ... + cn by Horner's rule, highest coefficient first, every product
/// rounded on its own (rounded_product): h = c0, then h = h x + ci for each next ci. A negative
/// coefficient is the same as subtracting its magnitude (a - b == a + (-b) in IEEE arithmetic).
template <class... Coefficients>
    requires(std::same_as<Coefficients, float> && ...)
[[nodiscard, gnu::always_inline]] constexpr float horner(float x, float c0, Coefficients... rest) noexcept
{
    float h = c0;
    ((h = rounded_product(h, x) + rest), ...);
    return h;
}

/// e^x = p * 2^k for finite x in [-104, 89]: k = round(x / ln 2), p = e^r for
/// r = x - k ln 2 in about [-ln2/2, ln2/2] (k ln2_hi is exact: 8 bits times 15), p within 1 ulp.
struct exp_parts {
    float p;
    std::int32_t k;
};
[[nodiscard, gnu::always_inline]] constexpr exp_parts exp_reduce(float x) noexcept
{
    constexpr float shifter = 0x1.8p23f;  // adding it rounds to an integer, kept in the low bits
    const float shifted = rounded_product(x, 0x1.715476p+0f) + shifter;  // x log2(e)
    const float k = shifted - shifter;
    const auto k_int = static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(shifted) - std::bit_cast<std::uint32_t>(shifter));
    const float r = (x - rounded_product(k, 0x1.62e4p-1f)) - rounded_product(k, 0x1.7f7d1cp-20f);  // ln2 = hi + lo
    // e^r = 1 + r + r^2 q(r), q a minimax fit on [-ln2/2, ln2/2] (error 1.4e-9)
    const float q = horner(r, 0x1.a124e4p-13f, 0x1.6d4316p-10f, 0x1.1110e0p-7f, 0x1.5554eap-5f, 0x1.555556p-3f, 0x1.0p-1f);
    return {1.0f + (r + rounded_product(rounded_product(r, r), q)), k_int};
}

/// 2^k for k in [-126, 127].
[[nodiscard, gnu::always_inline]] constexpr float exp2_int(std::int32_t k) noexcept
{
    return std::bit_cast<float>(static_cast<std::uint32_t>(k + 127) << 23);
}

}  // namespace detail

namespace math {

// exp, erf and their helpers are always inlined: the loops that call them (GELU, softmax) only
// vectorise with the body inline, and GCC's inliner stops inlining a function once it has enough
// callers in a program (a second caller of exp took GELU's backward out of vector lanes: 2.7x slower).

/// e^x within 1 ulp, the same bits on every CPU: +inf from 88.72284 on, 0 from -103.97208 down
/// (subnormal results rounded once), NaN for NaN, exp(-inf) = 0, exp(inf) = inf.
[[nodiscard, gnu::always_inline]] constexpr float exp(float x) noexcept
{
    using detail::bit_select;
    // Results that round to 0 or inf (and NaN) are chosen at the end; their lanes compute e^0, so
    // that no lane underflows: an underflow to 0 or to a subnormal takes a microcode assist on x86
    // (clamped to -104, the masked scores of a causal softmax, -inf, all did: char_lm's softmax
    // took 9.4 % of a step in perf against 3.9 % without).
    const bool zero = x < -0x1.9fe368p+6f;     // -103.972076, the last x whose e^x exceeds 2^-150
    const bool infinite = x > 0x1.62e42ep+6f;  // 88.7228317, the last x whose e^x rounds to finite
    const bool not_a_number = x != x;
    const auto [p, k] = detail::exp_reduce(bit_select(zero | infinite | not_a_number, 0.0f, x));
    const std::int32_t half = k >> 1;  // k in [-150, 128]: two factors of 2^[-75, 64]
    using detail::exp2_int;
    const float result = detail::rounded_product(detail::rounded_product(p, exp2_int(half)), exp2_int(k - half));
    const float saturated = bit_select(zero, 0.0f, bit_select(infinite, std::numeric_limits<float>::infinity(), result));
    return bit_select(not_a_number, x, saturated);
}

/// erf(x) within 2 ulp, the same bits on every CPU: erf(+-0) = +-0, erf(+-inf) = +-1, NaN for
/// NaN; +-1 from |x| = 3.9192 on, where erf rounds to 1.
[[nodiscard, gnu::always_inline]] constexpr float erf(float x) noexcept
{
    using detail::rounded_product;
    using detail::bit_select;
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    const float a = std::bit_cast<float>(bits & 0x7fffffffu);
    // |x| < 1: x + x h(x^2), h(s) = erf(sqrt s) / sqrt s - 1 fitted on [0, 1] (error 1.2e-9)
    const float s = rounded_product(a, a);
    const float h = detail::horner(s, 0x1.4a5690p-14f, -0x1.a45088p-11f, 0x1.541270p-8f, -0x1.b7fabap-6f, 0x1.ce2d10p-4f,
                                   -0x1.81273ep-2f, 0x1.06eba8p-3f);
    const float small = a + rounded_product(a, h);
    // |x| >= 1: 1 - e^(g(|x|) - x^2), g(x) = log(erfc x) + x^2 fitted in x - 2.5 on [1, 3.95]
    // (error 7e-9); |x| clamped to [1, 3.95] (NaN to 3.95): erfc(3.95) < 2^-25 rounds away.
    const float b = bit_select(a < 1.0f, 1.0f, bit_select(a <= 3.95f, a, 3.95f));
    const float u = b - 2.5f;
    const float g = detail::horner(u, -0x1.261b54p-24f, 0x1.b2d388p-20f, -0x1.b2d4f0p-17f, 0x1.448514p-14f, -0x1.b92dfap-12f,
                                   0x1.1bcbaap-9f, -0x1.63ccb0p-7f, 0x1.cb9f8ap-5f, -0x1.692524p-2f, -0x1.8e8b72p+0f);
    const auto [p, k] = detail::exp_reduce(g - rounded_product(b, b));  // in [-17, -1]: one factor 2^k
    const float large = 1.0f - rounded_product(p, detail::exp2_int(k));
    const float magnitude = bit_select(a < 1.0f, small, large);
    const float result = std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | (bits & 0x80000000u));
    return bit_select(x != x, x, result);
}

/// std::exp: the double paths keep libm.
[[nodiscard]] inline double exp(double x) noexcept { return std::exp(x); }
/// std::erf: the double paths keep libm.
[[nodiscard]] inline double erf(double x) noexcept { return std::erf(x); }

}  // namespace math

}  // namespace scalify
