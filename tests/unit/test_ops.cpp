// Scaled primitives: value(op(a, b)) against op(value(a), value(b)) in double, over element types,
// policies, and scales from 2^-60 to 2^60 including 0; scale rules; strategies; bad input.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace scalify;
using Catch::Matchers::Contains;

namespace {

template <class T>
double as_double(const T& x)
{
    return static_cast<double>(static_cast<compute_t<T>>(x));
}

/// Relative precision of T (half an ulp at 1) and its smallest positive value, from the format
/// descriptor: Eigen 3.4's numeric_limits<Eigen::half>::epsilon() is 2^-13, not 2^-10.
template <class T>
double half_ulp()
{
    if constexpr (EncodedFloat<T>) return std::ldexp(1.0, -(float_traits<T>::format::mantissa_bits + 1));
    else return std::numeric_limits<T>::epsilon() / 2;
}
template <class T>
double smallest()
{
    if constexpr (EncodedFloat<T>) {
        using F = typename float_traits<T>::format;
        return std::ldexp(1.0, 1 - F::bias - F::mantissa_bits);
    } else {
        return std::numeric_limits<T>::denorm_min();
    }
}

template <class T, class P>
ScaledArray<T, P> random_array(std::mt19937& rng, std::vector<std::size_t> shape, float scale, double lo, double hi)
{
    std::uniform_real_distribution<double> magnitude(lo, hi);
    std::bernoulli_distribution negative(0.5);
    xt::xarray<T> data = xt::xarray<T>::from_shape(shape);
    for (auto& x : data) {
        const double v = magnitude(rng) * (negative(rng) ? -1 : 1);
        x = detail::store<T>(static_cast<float>(v));
    }
    return ScaledArray<T, P>(std::move(data), scale);
}

template <class P>
std::vector<float> test_scales(std::mt19937& rng, int max_exponent)
{
    std::uniform_int_distribution<int> exponent(-max_exponent, max_exponent);
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::vector<float> scales{0.0f, 1.0f, std::ldexp(1.0f, -max_exponent), std::ldexp(1.0f, max_exponent)};
    for (int i = 0; i < 6; ++i) {
        const float m = P::power_of_two ? 1.0f : mantissa(rng);
        scales.push_back(std::ldexp(m, exponent(rng)));
    }
    return scales;
}

template <class T, class P>
std::vector<double> values(const ScaledArray<T, P>& a)
{
    std::vector<double> out;
    for (const auto& x : a.data()) out.push_back(a.scale() == 0.0f ? 0.0 : as_double(x) * a.scale());
    return out;
}

struct checker {
    std::string what;
    int failures = 0;
    template <class R>
    void compare(const R& result, const std::vector<double>& expected, const std::vector<double>& bound)
    {
        const xt::xarray<double> got = xt::cast<double>(result.value());
        REQUIRE(got.size() == expected.size());
        for (std::size_t i = 0; i < expected.size(); ++i) {
            const double e = expected[i], g = got.data()[i];
            const bool ok = (std::isnan(e) && std::isnan(g)) || e == g || std::abs(g - e) <= bound[i];
            if (!ok && failures++ < 3) {
                FAIL_CHECK(what << " element " << i << ": got " << g << ", expected " << e << " +- " << bound[i]
                                << " (result scale " << result.scale() << ")");
            }
        }
    }
};

/// The element-wise binary ops against double, for one pair of operand types and policies.
template <class A, class PA, class B, class PB>
void check_binary_ops(std::uint32_t seed)
{
    using R = promote_t<A, B>;
    std::mt19937 rng(seed);
    const std::vector<std::size_t> shape{3, 17};
    for (const float sa : test_scales<PA>(rng, 60)) {
        for (const float sb : test_scales<PB>(rng, 60)) {
            const auto a = random_array<A, PA>(rng, shape, sa, 0.0, 8.0);
            const auto b = random_array<B, PB>(rng, shape, sb, 0.5, 8.0);  // away from 0: div stays in range
            const auto va = values(a), vb = values(b);
            const std::size_t n = va.size();
            const auto run = [&](const char* name, const auto& result, auto reference, double relative_terms) {
                checker check{std::string(name) + " scales " + std::to_string(sa) + ", " + std::to_string(sb)};
                std::vector<double> expected(n), bound(n);
                const double floor = smallest<R>() * result.scale();
                for (std::size_t i = 0; i < n; ++i) {
                    expected[i] = reference(va[i], vb[i]);
                    // Storage rounding of the result, plus float32 rounding of the rescaled operands.
                    bound[i] = half_ulp<R>() * std::abs(expected[i]) +
                               relative_terms * 1.2e-7 * (std::abs(va[i]) + std::abs(vb[i])) + floor +
                               1.2e-7 * std::abs(expected[i]);
                }
                check.compare(result, expected, bound);
            };
            run("add", add(a, b), [](double x, double y) { return x + y; }, 2);
            run("sub", sub(a, b), [](double x, double y) { return x - y; }, 2);
            run("maximum", maximum(a, b), [](double x, double y) { return std::max(x, y); }, 1);
            run("minimum", minimum(a, b), [](double x, double y) { return std::min(x, y); }, 1);
            if (sa != 0.0f && sb != 0.0f) {
                // Products: relative error only.
                const auto relative_run = [&](const char* name, const auto& result, auto reference) {
                    checker check{std::string(name) + " scales " + std::to_string(sa) + ", " + std::to_string(sb)};
                    std::vector<double> expected(n), bound(n);
                    for (std::size_t i = 0; i < n; ++i) {
                        expected[i] = reference(va[i], vb[i]);
                        bound[i] = (half_ulp<R>() + 3e-7) * std::abs(expected[i]) + smallest<R>() * result.scale();
                    }
                    check.compare(result, expected, bound);
                };
                relative_run("mul", mul(a, b), [](double x, double y) { return x * y; });
                relative_run("div", div(a, b), [](double x, double y) { return x / y; });
            } else {
                const auto product = mul(a, b);
                CHECK(product.scale() == 0.0f);
                for (double v : values(product)) CHECK(v == 0.0);
            }
        }
    }
}

}  // namespace

TEST_CASE("element-wise ops equal the double computation within the result type's rounding", "[ops][numerics]")
{
    SECTION("float x float, float_scale") { check_binary_ops<float, float_scale, float, float_scale>(1); }
    SECTION("e4m3fn x e4m3fn, pow2_scale") { check_binary_ops<float8_e4m3fn, pow2_scale, float8_e4m3fn, pow2_scale>(2); }
    SECTION("e4m3fn x e4m3fn, float_scale") { check_binary_ops<float8_e4m3fn, float_scale, float8_e4m3fn, float_scale>(3); }
    SECTION("e5m2 x e4m3fn (mixed types -> float), mixed policies") { check_binary_ops<float8_e5m2, pow2_scale, float8_e4m3fn, float_scale>(4); }
    SECTION("e4m3fn x float") { check_binary_ops<float8_e4m3fn, pow2_scale, float, float_scale>(5); }
    SECTION("bfloat16 x bfloat16") { check_binary_ops<Eigen::bfloat16, pow2_scale, Eigen::bfloat16, pow2_scale>(6); }
    SECTION("half x half") { check_binary_ops<Eigen::half, float_scale, Eigen::half, float_scale>(7); }
    SECTION("double x double") { check_binary_ops<double, float_scale, double, float_scale>(8); }
}

TEST_CASE("unary ops equal the double computation", "[ops][numerics]")
{
    std::mt19937 rng(11);
    for (const float s : test_scales<pow2_scale>(rng, 60)) {
        const auto a = random_array<float8_e4m3fn, pow2_scale>(rng, {4, 9}, s, 0.0, 8.0);
        const auto va = values(a);
        const auto check_unary = [&](const char* name, const auto& result, auto reference, double relative) {
            checker check{std::string(name) + " scale " + std::to_string(s)};
            std::vector<double> expected, bound;
            for (double v : va) {
                expected.push_back(reference(v));
                bound.push_back(relative * std::abs(expected.back()) + smallest<float8_e4m3fn>() * result.scale());
            }
            check.compare(result, expected, bound);
        };
        const double h = half_ulp<float8_e4m3fn>() + 1e-6;
        check_unary("neg", neg(a), [](double v) { return -v; }, 1e-7);
        check_unary("abs", abs(a), [](double v) { return std::abs(v); }, 1e-7);
        check_unary("relu", relu(a), [](double v) { return std::max(v, 0.0); }, 1e-7);
        check_unary("gelu", gelu(a), [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }, h);
        check_unary("sqrt", sqrt(abs(a)), [](double v) { return std::sqrt(std::abs(v)); }, h);
        if (s <= 0.5f) check_unary("exp", exp(a), [](double v) { return std::exp(v); }, h);
        if (s != 0.0f) {
            // log is exact in float then rounded to e4m3fn: absolute error scales with |log|.
            check_unary("log", log(abs(a)), [](double v) { return std::log(std::abs(v)); }, h);
        }
    }
}

TEST_CASE("transpose equals xtensor's strided transpose for every permutation up to rank 5", "[ops][shape]")
{
    // Extents that leave partial 32-wide tiles, and unit axes.
    const std::vector<std::size_t> extents{3, 1, 35, 2, 4};
    for (std::size_t rank = 0; rank <= 5; ++rank) {
        std::vector<std::size_t> shape(extents.begin(), extents.begin() + static_cast<std::ptrdiff_t>(rank));
        if (rank == 2) shape = {37, 70};
        xt::xarray<float> data = xt::xarray<float>::from_shape(shape);
        for (std::size_t i = 0; i < data.size(); ++i) data.data()[i] = static_cast<float>(i);
        const auto a = make_scaled_array<pow2_scale>(data, 4.0f);
        std::vector<std::size_t> perm(rank);
        for (std::size_t d = 0; d < rank; ++d) perm[d] = d;
        do {
            const auto t = transpose(a, perm);
            const xt::xarray<float> expected = xt::transpose(data, perm);
            INFO("shape " << shape_string(shape) << ", perm " << shape_string(perm));
            CHECK(t.scale() == 4.0f);
            CHECK(t.data() == expected);
        } while (std::next_permutation(perm.begin(), perm.end()));
        CHECK(transpose(a).data() == xt::xarray<float>(xt::transpose(data)));
    }
}

TEST_CASE("retain_freed_memory hands glibc's allocator its settings", "[runtime]")
{
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SCALIFY_TEST_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(SCALIFY_TEST_UNDER_ASAN)
    // The sanitizer's allocator replaces glibc's and ignores mallopt.
    (void)retain_freed_memory();
#elif defined(__GLIBC__)
    CHECK(retain_freed_memory());
    CHECK(retain_freed_memory(std::size_t{1} << 40));  // beyond int: the largest trim threshold
#else
    CHECK_FALSE(retain_freed_memory());
#endif
}

TEST_CASE("scale rules of the default strategy", "[ops][scale_rules]")
{
    const auto a = make_scaled_array<pow2_scale>(xt::xarray<float>{{1, 2}, {3, 4}}, 4.0f);
    const auto b = make_scaled_array<pow2_scale>(xt::xarray<float>{{1, 0}, {0, 1}}, 0.5f);
    CHECK(add(a, b).scale() == 4.0f);
    CHECK(sub(a, b).scale() == 4.0f);
    CHECK(mul(a, b).scale() == 2.0f);
    CHECK(div(a, b).scale() == 8.0f);
    CHECK(maximum(a, b).scale() == 4.0f);
    // 2 * sqrt(2) (K = 2) is the log2 midpoint between 2 and 4; its float, just below it, is the
    // tie and rounds up, as pow2_scale documents.
    CHECK(matmul(a, b).scale() == 4.0f);
    CHECK(neg(a).scale() == 4.0f);
    CHECK(relu(a).scale() == 4.0f);
    CHECK(exp(a).scale() == 1.0f);
    CHECK(log(a).scale() == 1.0f);
    CHECK(reduce_max(a).scale() == 4.0f);
    CHECK(reduce_sum(a).scale() == 8.0f);  // 4 * sqrt(4)
    CHECK(cast<float8_e4m3fn>(a).scale() == 4.0f);
    CHECK(softmax(a, 1).scale() == 1.0f);

    // Under float_scale the rules are not rounded.
    const auto f = make_scaled_array(xt::xarray<float>::from_shape({2, 3}), 1.0f);
    const auto g = make_scaled_array(xt::xarray<float>::from_shape({3, 2}), 1.0f);
    CHECK(matmul(f, g).scale() == Approx(std::sqrt(3.0f)));
    CHECK(reduce_sum(f, {1}).scale() == Approx(std::sqrt(3.0f)));

    // sqrt under pow2: an even exponent stays exact, an odd one folds sqrt(2) into the data.
    const auto even = make_scaled_array<pow2_scale>(xt::xarray<float>{4.0f}, 16.0f);
    CHECK(sqrt(even).scale() == 4.0f);
    CHECK(sqrt(even).data()(0) == 2.0f);
    const auto odd = make_scaled_array<pow2_scale>(xt::xarray<float>{4.0f}, 8.0f);
    const auto root = sqrt(odd);
    CHECK(is_pow2_or_zero(root.scale()));
    CHECK(root.value()(0) == Approx(std::sqrt(32.0f)));

    // Scalars fold into the scale.
    const auto doubled = mul(a, 2.0);
    CHECK(doubled.scale() == 8.0f);
    CHECK((doubled.data() == a.data()));
    const auto tripled = mul(a, -3.0);
    CHECK(tripled.scale() == 8.0f);  // 2 folds, -1.5 multiplies the data
    CHECK(tripled.value()(0, 0) == -12.0f);
    const auto fs = make_scaled_array(xt::xarray<float>{1.0f}, 1.0f);
    CHECK(mul(fs, 3.0).scale() == 3.0f);
    CHECK(div(fs, 4.0).scale() == 0.25f);
    CHECK(mul(fs, 0.0).scale() == 0.0f);
}

TEST_CASE("unit_scaling and dynamic_abs strategies", "[ops][strategies]")
{
    const auto a = make_scaled_array(xt::xarray<float>{1.0f, 2.0f}, 3.0f);
    const auto b = make_scaled_array(xt::xarray<float>{1.0f, -1.0f}, 4.0f);
    const auto u = add<unit_scaling>(a, b);
    CHECK(u.scale() == 5.0f);
    CHECK(u.value()(0) == Approx(7.0f));
    CHECK(u.value()(1) == Approx(2.0f));

    // dynamic_abs fills the target format: the data's amax lands in (max/2, max].
    std::mt19937 rng(3);
    const auto x = random_array<float, pow2_scale>(rng, {32, 64}, 1.0f, 0.0, 1.0);
    const auto w = random_array<float8_e4m3fn, pow2_scale>(rng, {64, 16}, 0.125f, 0.0, 2.0);
    const auto y = matmul<dynamic_abs<float8_e4m3fn>, float8_e4m3fn>(x, w);
    float amax = 0;
    for (const auto& d : y.data()) amax = std::max(amax, std::abs(static_cast<float>(d)));
    CHECK(amax <= 448.0f);
    CHECK(amax > 224.0f);
    CHECK(is_pow2_or_zero(y.scale()));
    const auto y_margin = matmul<dynamic_abs<float8_e4m3fn, 2>, float8_e4m3fn>(x, w);
    CHECK(y_margin.scale() == 4.0f * y.scale());
    // Same values as the static default, within e4m3fn rounding.
    const auto reference = matmul<default_scaling, float>(x, w).value();
    const xt::xarray<float> got = y.value();
    for (std::size_t i = 0; i < got.size(); ++i) {
        CHECK(std::abs(got.data()[i] - reference.data()[i]) <= 0.0625 * std::abs(reference.data()[i]) + 1e-3f * y.scale());
    }
    // All zeros keep the natural scale.
    const auto zeros = make_scaled_array(xt::xarray<float>{0.0f, 0.0f}, 2.0f);
    CHECK(add<dynamic_abs<float8_e4m3fn>>(zeros, zeros).scale() == 2.0f);
}

// A user strategy and a user override of one op's rule: no op changes.
namespace {
struct always_one {
    static constexpr bool needs_amax = false;
    template <ScalePolicy Policy, class Op>
    static float output_scale(Op, const scale_request&) noexcept
    {
        return 1.0f;
    }
};
struct my_project_scaling : default_scaling {};
}  // namespace

template <>
struct scalify::scaling_traits<scalify::ops::add, my_project_scaling> {
    template <ScalePolicy Policy>
    static float output_scale(const scale_request& request)
    {
        return 2.0f * request.natural;  // this project wants headroom on sums
    }
};

TEST_CASE("strategies are user-extensible through scaling_traits", "[ops][strategies]")
{
    static_assert(ScalingStrategy<always_one>);
    static_assert(ScalingStrategy<my_project_scaling>);
    static_assert(ScalingStrategy<dynamic_abs<float8_e5m2, 3>>);
    static_assert(!ScalingStrategy<int>);
    const auto a = make_scaled_array(xt::xarray<float>{1.0f, 2.0f}, 8.0f);
    CHECK(matmul<always_one>(reshape(a, {1, 2}), reshape(a, {2, 1})).scale() == 1.0f);
    CHECK(matmul<always_one>(reshape(a, {1, 2}), reshape(a, {2, 1})).value()(0, 0) == 320.0f);
    CHECK(add<my_project_scaling>(a, a).scale() == 16.0f);
    CHECK(add<my_project_scaling>(a, a).value()(1) == 32.0f);
    CHECK(mul<my_project_scaling>(a, a).scale() == 64.0f);  // other ops: the default rule
}

TEST_CASE("lane_max: numpy.max's value on integer keys, in any order", "[ops]")
{
    using scalify::detail::lane_max;
    constexpr float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const auto max_of = [](std::vector<float> v, float lowest = -std::numeric_limits<float>::infinity()) {
        return lane_max<float>(v.size(), [&](std::size_t i) { return v[i]; }, lowest);
    };
    CHECK(max_of({}) == -inf);
    CHECK(max_of({}, 3.0f) == 3.0f);
    CHECK(max_of({-3.0f, -1e-40f, -7.0f}) == -1e-40f);  // negatives ordered, subnormals included
    CHECK(max_of({-inf, -inf}) == -inf);
    CHECK(max_of({1.0f, inf, 2.0f}) == inf);
    CHECK_FALSE(std::signbit(max_of({-0.0f, 0.0f, -0.0f})));  // +0 above -0, whatever the order
    CHECK_FALSE(std::signbit(max_of({0.0f, -0.0f})));
    CHECK(std::signbit(max_of({-0.0f, -1.0f})));
    std::vector<float> row(37, 1.0f);
    row[29] = -nan;  // a NaN of either sign, anywhere
    CHECK(std::isnan(max_of(row)));
    row[29] = 5.0f;
    CHECK(max_of(row) == 5.0f);
    CHECK(lane_max<double>(3, [](std::size_t i) { return -double(i) - 0.5; }, -inf) == -0.5);

    // softmax: a NaN poisons its own lane only
    xt::xarray<float> logits = xt::zeros<float>({2, 20});
    logits(0, 13) = nan;
    const auto p = softmax(make_scaled_array(logits, 1.0f), 1).value();
    CHECK(std::isnan(p(0, 0)));
    CHECK(p(1, 0) == Approx(1.0f / 20));
}

TEST_CASE("softmax along any axis gives the bits of the last axis, blocks of lanes side by side", "[ops]")
{
    // Lanes along axis 0 of (3, 11, 70) run in blocks of 64 adjacent lanes and a block of 6; each
    // lane sums in its own order, as along the last axis: transposing the axis to the end and back
    // gives the same bits, a NaN lane included.
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-8.0f, 8.0f);
    xt::xarray<float> x = xt::xarray<float>::from_shape({3, 11, 70}), g = xt::xarray<float>::from_shape({3, 11, 70});
    for (auto& v : x) v = uniform(rng);
    for (auto& v : g) v = uniform(rng);
    x(1, 4, 65) = std::numeric_limits<float>::quiet_NaN();
    const auto a = make_scaled_array<pow2_scale>(x, 0.5f);
    const auto ga = cast<Eigen::bfloat16>(make_scaled_array<pow2_scale>(g, 2.0f));
    const auto same_bits = [](const auto& p, const auto& q) {
        REQUIRE(p.scale() == q.scale());
        REQUIRE(p.shape() == q.shape());
        using E = typename std::remove_cvref_t<decltype(p)>::value_type;
        CHECK(std::memcmp(p.data().data(), q.data().data(), p.size() * sizeof(E)) == 0);
    };
    for (std::size_t axis = 0; axis < 3; ++axis) {
        CAPTURE(axis);
        std::vector<std::size_t> to_last, back(3);
        for (std::size_t d = 0; d < 3; ++d)
            if (d != axis) to_last.push_back(d);
        to_last.push_back(axis);
        for (std::size_t d = 0; d < 3; ++d) back[to_last[d]] = d;
        const auto last = [&](const auto& t) { return transpose(t, to_last); };
        const auto restored = [&](const auto& t) { return transpose(t, back); };
        same_bits(softmax(a, axis), restored(softmax(last(a), 2)));
        same_bits(softmax<dynamic_abs<float8_e4m3fn>>(a, axis), restored(softmax<dynamic_abs<float8_e4m3fn>>(last(a), 2)));
        same_bits(log_softmax<unit_scaling>(a, axis), restored(log_softmax<unit_scaling>(last(a), 2)));
        const auto y = softmax(a, axis);
        same_bits(softmax_vjp(ga, y, axis), restored(softmax_vjp(last(ga), last(y), 2)));
        same_bits(log_softmax_vjp(ga, log_softmax(a, axis), axis),
                  restored(log_softmax_vjp(last(ga), last(log_softmax(a, axis)), 2)));
    }
}

TEST_CASE("reductions, softmax, where, layout ops", "[ops]")
{
    const auto a = make_scaled_array<pow2_scale>(xt::xarray<float>{{1, -2, 3}, {4, 5, -6}}, 0.5f);
    CHECK(reduce_sum(a).value()() == Approx(2.5f));
    const auto rows_sum = reduce_sum(a, {1}).value();
    CHECK(rows_sum(0) == Approx(1.0f));
    CHECK(rows_sum(1) == Approx(1.5f));
    CHECK(reduce_sum(a, {0}).value()(2) == Approx(-1.5f));
    CHECK(reduce_max(a).value()() == 2.5f);
    CHECK(reduce_max(a, {0}).value()(1) == 2.5f);
    CHECK(reduce_sum(a, {0, 1}).value()() == Approx(2.5f));
    CHECK_THROWS_WITH(reduce_sum(a, {2}), Contains("shape (2, 3)"));
    CHECK_THROWS_AS(reduce_sum(a, {1, 1}), shape_error);
    CHECK_THROWS_WITH(reduce_sum(a, {1, 1}), Contains("axes [1, 1] are not distinct"));
    const auto with_nan = make_scaled_array(xt::xarray<float>{1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f}, 1.0f);
    CHECK(std::isnan(reduce_max(with_nan).value()()));
    CHECK(std::isnan(maximum(with_nan, with_nan).value()(1)));

    const auto p = softmax(a, 1).value();
    CHECK(p(0, 0) + p(0, 1) + p(0, 2) == Approx(1.0f));
    CHECK(p(1, 1) == Approx(std::exp(2.5) / (std::exp(2.0) + std::exp(2.5) + std::exp(-3.0))));
    const auto huge = make_scaled_array(xt::xarray<float>{1.0f, 2.0f}, std::ldexp(1.0f, 100));
    const auto ph = softmax(huge, 0).value();
    CHECK(ph(0) == 0.0f);
    CHECK(ph(1) == 1.0f);

    const auto b = make_scaled_array<pow2_scale>(xt::xarray<float>{10, 20, 30}, 2.0f);
    xt::xarray<bool> cond{{true, false, true}, {false, true, false}};
    const auto w = where(cond, a, b);
    CHECK(w.scale() == 2.0f);
    CHECK(w.value()(0, 0) == 0.5f);
    CHECK(w.value()(0, 1) == 40.0f);
    CHECK(w.value()(1, 1) == 2.5f);

    const auto t = transpose(a);
    CHECK(t.shape()[0] == 3);
    CHECK(t.value()(2, 1) == -3.0f);
    CHECK(transpose(a, {1, 0}).value()(0, 1) == 2.0f);
    CHECK_THROWS_AS(transpose(a, {0, 0}), shape_error);
    const auto r = reshape(a, {3, 2});
    CHECK(r.value()(1, 0) == 1.5f);
    CHECK_THROWS_WITH(reshape(a, {4, 2}), Contains("(2, 3)"));
    CHECK(rows(a, 1, 2).value()(0, 2) == -3.0f);
    CHECK_THROWS_WITH(rows(a, 1, 3), Contains("[1, 3) along axis 0 is outside shape (2, 3)"));
    CHECK(slice(a, 1, 1, 3).shape()[1] == 2);

    const auto c = concatenate({a, reshape(make_scaled_array<pow2_scale>(xt::xarray<float>{7.0f, 8.0f}, 4.0f), {2, 1})}, 1);
    CHECK(c.scale() == 4.0f);
    CHECK(c.shape()[1] == 4);
    CHECK(c.value()(1, 2) == -3.0f);
    CHECK(c.value()(1, 3) == 32.0f);
    CHECK_THROWS_AS(concatenate({a, reshape(make_scaled_array<pow2_scale>(xt::xarray<float>{7.0f, 8.0f, 9.0f}, 4.0f), {3, 1})}, 1), shape_error);
}

TEST_CASE("concatenate under an amax scale: a braced list and a vector give the exact join's values", "[ops]")
{
    using A = ScaledArray<float, pow2_scale>;
    const A a(xt::xarray<float>{{1.0f, -2.0f}, {3.0f, 0.5f}}, 0.5f), b(xt::xarray<float>{{7.0f, -8.0f}}, 4.0f);
    const auto braced = concatenate<dynamic_abs<float8_e4m3fn>>({a, b}, 0);
    const auto listed = concatenate<dynamic_abs<float8_e4m3fn>>(std::vector<A>{a, b}, 0);
    REQUIRE(braced.shape() == std::vector<std::size_t>{3, 2});
    CHECK(braced.scale() == listed.scale());
    CHECK(braced.data() == listed.data());
    // amax 32 (-8 at scale 4) lands at or below E4M3's 448 with a power-of-two scale.
    const float expected[] = {0.5f, -1.0f, 1.5f, 0.25f, 28.0f, -32.0f};
    for (std::size_t i = 0; i < 6; ++i) CHECK(braced.value().data()[i] == expected[i]);
    CHECK(*std::max_element(braced.data().begin(), braced.data().end(), [](float x, float y) { return std::abs(x) < std::abs(y); }) <= 448.0f);
    // A smaller join after a larger one (the raw values' buffer is reused): its own values only.
    const auto small = concatenate<dynamic_abs<float8_e4m3fn>>({b, b}, 1);
    REQUIRE(small.size() == 4);
    CHECK(small.value()(0, 2) == 28.0f);
    CHECK(small.value()(0, 3) == -32.0f);
}

TEST_CASE("casts and rebalance_scale keep the value", "[ops]")
{
    const auto a = make_scaled_array<pow2_scale>(xt::xarray<float>{1.0f, 3.0f, 1000.0f, -0.3f}, 0.5f);
    const auto c = cast<float8_e4m3fn>(a);
    CHECK(c.scale() == 0.5f);
    CHECK(std::isnan(static_cast<float>(c.data()(2))));  // 1000 > 448: no saturation by default
    CHECK(static_cast<float>(cast<float8_e4m3fn, round_nearest_even, saturate_finite>(a).data()(2)) == 448.0f);
    CHECK(static_cast<float>(cast<float8_e4m3fn, round_toward_zero>(a).data()(3)) == -0.28125f);
    const auto s1 = cast<float8_e4m3fn, round_stochastic>(a, 42);
    const auto s2 = cast<float8_e4m3fn, round_stochastic>(a, 42);
    for (std::size_t i = 0; i < s1.size(); ++i) CHECK(s1.data()(i).bits() == s2.data()(i).bits());
    CHECK(cast<float>(c).data()(1) == 3.0f);

    const auto r = rebalance_scale(a, 8.0f);
    CHECK(r.scale() == 4.0f);
    CHECK((r.value() == a.value()));
    CHECK_THROWS_WITH(rebalance_scale(a, 3.0f), Contains("power-of-two factor, got 3"));
    CHECK_THROWS_AS(rebalance_scale(a, 0.0f), scale_error);
    CHECK_THROWS_AS(rebalance_scale(a, std::numeric_limits<float>::infinity()), scale_error);
}

TEST_CASE("operands of two element types give the bits of the same op on operands of one type", "[ops]")
{
    // Mixed operands are decoded into the compute type at the op's edge (docs/ops.md,
    // "Arithmetic"); E5M2 values are exact in bf16, so the same op on bf16 copies must agree.
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    xt::xarray<float> x = xt::xarray<float>::from_shape({4, 24}), y = x;
    for (auto& v : x) v = normal(rng);
    for (auto& v : y) v = normal(rng);
    y(1, 3) = 0.0f;
    const auto a = cast<Eigen::bfloat16>(make_scaled_array<pow2_scale>(x, 0.5f));
    const auto b = cast<float8_e5m2>(make_scaled_array<pow2_scale>(y, 2.0f));
    const auto b16 = cast<Eigen::bfloat16>(b);
    const auto same_bits = [](const auto& p, const auto& q) {
        REQUIRE(p.scale() == q.scale());
        REQUIRE(p.size() == q.size());
        using E = typename std::remove_cvref_t<decltype(p)>::value_type;
        CHECK(std::memcmp(p.data().data(), q.data().data(), p.size() * sizeof(E)) == 0);
    };
    same_bits(add<unit_scaling>(a, b), add<unit_scaling, float>(a, b16));  // promote_t<bf16, E5M2>: float
    same_bits(mul(a, b), mul<default_scaling, float>(a, b16));
    same_bits(div<unit_scaling>(b, a), div<unit_scaling, float>(b16, a));
    same_bits(maximum(a, b), maximum<default_scaling, float>(a, b16));
    const xt::xarray<bool> positive = x > 0.0f;
    same_bits(where(positive, a, b), where<default_scaling, float>(positive, a, b16));
    same_bits(relu_vjp<unit_scaling>(a, b), relu_vjp<unit_scaling>(a, b16));
    same_bits(gelu_vjp(a, b), gelu_vjp(a, b16));
    const auto probabilities = cast<float8_e5m2>(softmax(make_scaled_array<pow2_scale>(y, 1.0f), 1));
    same_bits(softmax_vjp<unit_scaling>(a, probabilities, 1), softmax_vjp<unit_scaling>(a, cast<Eigen::bfloat16>(probabilities), 1));
    same_bits(log_softmax_vjp(a, probabilities, 1), log_softmax_vjp(a, cast<Eigen::bfloat16>(probabilities), 1));
    same_bits(layer_norm_vjp<unit_scaling>(a, b), layer_norm_vjp<unit_scaling, Eigen::bfloat16>(cast<float>(a), b));
}

TEST_CASE("zero-scale operands are zero arrays", "[ops]")
{
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const auto a = make_scaled_array(xt::xarray<float>{1.0f, -2.0f}, 2.0f);
    const auto z = make_scaled_array(xt::xarray<float>{nan, nan}, 0.0f);
    CHECK((add(a, z).value() == a.value()));
    CHECK(add(z, z).scale() == 0.0f);
    CHECK(maximum(a, z).value()(1) == 0.0f);  // relu(a)
    CHECK(maximum(a, z).scale() == 2.0f);
    CHECK(mul(a, z).scale() == 0.0f);
    CHECK(matmul(reshape(a, {1, 2}), reshape(z, {2, 1})).value()(0, 0) == 0.0f);
    const auto q = div(a, z).value();
    CHECK(std::isinf(q(0)));
    CHECK(q(1) < 0);
    CHECK(exp(z).value()(0) == 1.0f);
    CHECK(std::isinf(log(z).value()(0)));
}

TEST_CASE("bad shapes are shape_errors naming both shapes", "[ops][errors]")
{
    const auto a = make_scaled_array(xt::xarray<float>::from_shape({2, 3}), 1.0f);
    const auto b = make_scaled_array(xt::xarray<float>::from_shape({4}), 1.0f);
    CHECK_THROWS_MATCHES(add(a, b), shape_error, Catch::Matchers::Message("add: shapes (2, 3) and (4,) do not broadcast"));
    CHECK_THROWS_MATCHES(matmul(a, a), shape_error,
                         Catch::Matchers::Message("matmul: shapes (2, 3) and (2, 3) do not multiply (need (M, K) and (K, N))"));
    CHECK_THROWS_AS(matmul(a, b), shape_error);
    // Broadcasting works where numpy's does.
    const auto row = make_scaled_array(xt::xarray<float>{1.0f, 2.0f, 3.0f}, 1.0f);
    CHECK(add(a, row).shape()[0] == 2);
    // Empty arrays.
    const auto e = make_scaled_array(xt::xarray<float>::from_shape({0, 3}), 1.0f);
    CHECK(add(e, e).size() == 0);
    CHECK(matmul(e, transpose(e)).size() == 0);
    CHECK((matmul(transpose(e), e).value() == xt::zeros<float>({3, 3})));
    CHECK(reduce_sum(e).value()() == 0.0f);
    // A scale that overflows float32 is reported, not stored.
    const auto big = make_scaled_array(xt::xarray<float>{1.0f}, std::ldexp(1.0f, 100));
    CHECK_THROWS_WITH(mul(big, big), Contains("mul: output scale inf"));
}

TEST_CASE("slice equals xtensor's strided view along every axis and element width", "[ops][shape]")
{
    // Runs shorter and longer than the 64-byte pieces slice copies in, with tails.
    const auto check = [](auto zero) {
        using T = decltype(zero);
        const std::vector<std::size_t> shape{3, 5, 7, 37};
        xt::xarray<T> data = xt::xarray<T>::from_shape(shape);
        for (std::size_t i = 0; i < data.size(); ++i) data.data()[i] = static_cast<T>(static_cast<float>(i % 251));
        const auto a = make_scaled_array<pow2_scale>(data, 2.0f);
        for (std::size_t axis = 0; axis < shape.size(); ++axis) {
            for (const auto& [first, last] : {std::pair<std::size_t, std::size_t>{0, 1}, {1, shape[axis]}, {0, shape[axis]}}) {
                xt::xstrided_slice_vector slices(shape.size(), xt::all());
                slices[axis] = xt::range(first, last);
                const xt::xarray<T> expected = xt::strided_view(data, slices);
                const auto s = slice(a, axis, first, last);
                INFO("axis " << axis << ", [" << first << ", " << last << ")");
                CHECK(s.scale() == 2.0f);
                CHECK(s.data() == expected);
            }
        }
    };
    check(0.0f);
    check(0.0);
    check(Eigen::half(0));
    check(float8_e4m3fn{});
}

TEST_CASE("fuzz regressions: slicing empty arrays", "[ops][fuzz_regression]")
{
    // fuzz_ops found xtensor's strided view offsetting the null data pointer of an empty array.
    const auto e = make_scaled_array(xt::xarray<float>::from_shape({0, 4}), 1.0f);
    const auto s = slice(e, 1, 1, 3);
    CHECK(s.shape()[0] == 0);
    CHECK(s.shape()[1] == 2);
    const auto a = make_scaled_array(xt::xarray<float>{1.0f, 2.0f}, 1.0f);
    CHECK(slice(a, 0, 1, 1).size() == 0);
}

TEST_CASE("fuzz regressions: extreme scale ratios keep full precision", "[ops][fuzz_regression]")
{
    // fuzz_ops found add losing precision when sa / sb is below float's normal range: the ratio
    // became a subnormal factor with a few bits. It is now applied in two steps.
    const auto a = make_scaled_array(xt::xarray<float>{-1.07e8f}, 8.2e-5f);
    const auto b = make_scaled_array(xt::xarray<float>{-1.57e-38f}, std::numeric_limits<float>::max());
    const double want = -1.07e8 * double(8.2e-5f) + -1.57e-38 * double(std::numeric_limits<float>::max());
    const double got = add(a, b).value()(0);
    CHECK(std::abs(got - want) <= 1e-6 * std::abs(want));
}
