#pragma once
// Shared by the autodiff tests: random arrays and chains, and the bit-for-bit check of a chain's
// autodiff gradients against the hand-composed backward rules (test_autodiff*.cpp).
#include "random_chain.hpp"

#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace scalify::testing {

template <class T, class P = float_scale>
ScaledArray<T, P> random_array(std::mt19937& rng, std::vector<std::size_t> shape, float scale)
{
    std::normal_distribution<float> normal(0.0f, 1.0f);
    xt::xarray<T> data = xt::xarray<T>::from_shape(shape);
    for (auto& x : data) x = static_cast<T>(normal(rng));
    return ScaledArray<T, P>(std::move(data), scale);
}

inline chain random_chain(std::mt19937& rng, std::size_t length)
{
    std::uniform_int_distribution<int> pick(0, static_cast<int>(chain_op_count) - 1);
    chain program;
    for (std::size_t i = 0; i < length; ++i) program.ops.push_back(static_cast<chain_op>(pick(rng)));
    // c and bias are always used, so every parameter is part of the graph.
    program.ops.push_back(chain_op::mul_c);
    program.ops.push_back(chain_op::add_bias);
    std::shuffle(program.ops.begin(), program.ops.end(), rng);
    return program;
}

inline float random_pow2_scale(std::mt19937& rng)
{
    return std::ldexp(1.0f, std::uniform_int_distribution<int>(-40, 40)(rng));
}

/// Autodiff gradients of the chain equal the hand composition bit for bit.
template <class Strategy, class T, class P>
void check_chain_bits(std::mt19937& rng)
{
    const std::size_t m = std::uniform_int_distribution<std::size_t>(1, 9)(rng);
    const std::size_t k = std::uniform_int_distribution<std::size_t>(1, 17)(rng);
    const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 9)(rng);
    const auto program = random_chain(rng, std::uniform_int_distribution<std::size_t>(1, 5)(rng));
    const auto a = random_array<T, P>(rng, {m, k}, random_pow2_scale(rng));
    const auto b = random_array<T, P>(rng, {k, n}, random_pow2_scale(rng));
    const auto c = random_array<T, P>(rng, {m, n}, random_pow2_scale(rng));
    const auto bias = random_array<T, P>(rng, {n}, random_pow2_scale(rng));

    ad::tape<P> tape;
    const auto va = tape.template watch<Strategy>(a);
    const auto vb = tape.template watch<Strategy>(b);
    const auto vc = tape.template watch<Strategy>(c);
    const auto vbias = tape.template watch<Strategy>(bias);
    INFO("shapes " << m << "x" << k << "x" << n << ", " << program.ops.size() << " ops");
    try {
        tape.backward(program(va, vb, vc, vbias));
    } catch (const scale_error&) {
        // A rule's scale left float32 (exp of a value scaled by 2^40 under unit_scaling): the
        // hand composition must fail the same way.
        CHECK_THROWS_AS(hand_gradients<Strategy>(program, a, b, c, bias), scale_error);
        return;
    }
    const auto hand = hand_gradients<Strategy>(program, a, b, c, bias);
    INFO("shapes " << m << "x" << k << "x" << n << ", " << program.ops.size() << " ops");
    CHECK(same_bits(tape.gradient_of(va), hand.a));
    CHECK(same_bits(tape.gradient_of(vb), hand.b));
    CHECK(same_bits(tape.gradient_of(vc), hand.c));
    CHECK(same_bits(tape.gradient_of(vbias), hand.bias));
}

/// f(value) through plain ScaledArrays in double, for finite differences.
template <class P>
double chain_value(const chain& program, const ScaledArray<double, P>& a, const ScaledArray<double, P>& b,
                   const ScaledArray<double, P>& c, const ScaledArray<double, P>& bias)
{
    return program(a, b, c, bias).value()();
}

}  // namespace scalify::testing
