// Reverse-mode autodiff: gradients against central finite differences in double (the bit-for-bit
// checks of random chains are in test_autodiff_chains.cpp), parameter trees, gradient-path ops,
// the matmul recipe scope, and the errors of misuse.
#include "../support/autodiff_checks.hpp"

#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

using namespace scalify;
using scalify::testing::chain;
using scalify::testing::chain_op;
using scalify::testing::chain_value;
using scalify::testing::random_array;
using scalify::testing::random_chain;
using scalify::testing::random_pow2_scale;

TEST_CASE("autodiff gradients agree with central finite differences in double", "[autodiff]")
{
    std::mt19937 rng(7);
    int redrawn = 0;
    for (int trial = 0; trial < 20; ++trial) {
        const std::size_t m = 3, k = 4, n = 5;
        const auto program = random_chain(rng, 3);
        std::vector<ScaledArray<double, float_scale>> params{
            random_array<double>(rng, {m, k}, random_pow2_scale(rng) * 1.5f), random_array<double>(rng, {k, n}, random_pow2_scale(rng)),
            random_array<double>(rng, {m, n}, random_pow2_scale(rng)), random_array<double>(rng, {n}, random_pow2_scale(rng))};
        // Keep values O(1) so exp and softmax stay in range: scales only move data/scale balance.
        for (auto& p : params) p = ScaledArray<double, float_scale>(xt::xarray<double>(p.data() / double(p.scale())), p.scale());

        // Scales of 2^+-40 multiply along a chain (mul by c, c's row in a batched matmul): a chain
        // whose scales leave float32 ends in the documented scale_error, and is drawn again.
        std::vector<ad::gradient<float_scale>> grads;
        try {
            grads = ad::grad([&](const auto& ps) { return program(ps[0], ps[1], ps[2], ps[3]); }, params);
        } catch (const scale_error&) {
            REQUIRE(++redrawn < 40);
            --trial;
            continue;
        }
        for (std::size_t which = 0; which < params.size(); ++which) {
            const xt::xarray<float> analytic = grads[which].value();
            for (std::size_t i = 0; i < params[which].size(); ++i) {
                auto plus = params, minus = params;
                const double step = 1e-6;
                auto bump = [&](auto& p, double delta) {
                    xt::xarray<double> d = p.data();
                    d.data()[i] += delta / double(p.scale());
                    p = ScaledArray<double, float_scale>(std::move(d), p.scale());
                };
                bump(plus[which], step);
                bump(minus[which], -step);
                const double fd = (chain_value(program, plus[0], plus[1], plus[2], plus[3]) -
                                   chain_value(program, minus[0], minus[1], minus[2], minus[3])) /
                                  (2 * step);
                INFO("trial " << trial << " parameter " << which << " element " << i);
                CHECK(std::abs(fd - double(analytic.data()[i])) <= 1e-4 * std::max(1.0, std::abs(fd)));
            }
        }
    }
}

TEST_CASE("every differentiable op matches finite differences", "[autodiff]")
{
    std::mt19937 rng(11);
    using A = ScaledArray<double, float_scale>;
    const A x = random_array<double>(rng, {3, 4}, 0.5f);
    const A y = random_array<double>(rng, {3, 4}, 2.0f);
    const xt::xarray<bool> mask = x.value() > 0.0;
    const std::vector<std::uint8_t> labels{1, 3, 0};

    const auto check = [&](const char* name, auto f) {
        const auto grads = ad::grad(f, x, y);
        const A* params[] = {&x, &y};
        for (int which = 0; which < 2; ++which) {
            const xt::xarray<float> analytic = (which == 0 ? std::get<0>(grads) : std::get<1>(grads)).value();
            for (std::size_t i = 0; i < x.size(); ++i) {
                auto eval = [&](double delta) {
                    A p[] = {x, y};
                    xt::xarray<double> d = p[which].data();
                    d.data()[i] += delta / double(params[which]->scale());
                    p[which] = A(std::move(d), params[which]->scale());
                    using V = ad::var<double>;  // constants: no tape, the same arithmetic
                    return double(f(V(p[0]), V(p[1])).value().value()());
                };
                const double fd = (eval(1e-6) - eval(-1e-6)) / 2e-6;
                INFO(name << " input " << which << " element " << i);
                CHECK(std::abs(fd - double(analytic.data()[i])) <= 1e-4 * std::max(1.0, std::abs(fd)));
            }
        }
    };
    const auto sum = [](const auto& v) { return reduce_sum(v); };
    check("sub", [&](const auto& a, const auto& b) { return sum((a - b) * a); });
    check("div", [&](const auto& a, const auto& b) { return sum(a / (b * b + A(xt::ones<double>({4}), 1.0f))); });
    check("minimum", [&](const auto& a, const auto& b) { return sum(minimum(a, b) * a); });
    check("log sqrt", [&](const auto& a, const auto& b) { return sum(log(sqrt(a * a + b * b))); });
    check("where", [&](const auto& a, const auto& b) { return sum(where(mask, a * b, b)); });
    check("reduce_max", [&](const auto& a, const auto& b) { return sum(reduce_max(a * b, {1}) * 3.0); });
    check("reduce_sum axis", [&](const auto& a, const auto& b) { return sum(exp(reduce_sum(a, {0})) * reduce_sum(b, {0})); });
    check("layout", [&](const auto& a, const auto& b) {
        return sum(reshape(transpose(a, {1, 0}), {2, 6}) * reshape(b, {2, 6}));
    });
    check("slice concatenate", [&](const auto& a, const auto& b) {
        using V = std::remove_cvref_t<decltype(slice(a, 1, 0, 2))>;
        return sum(concatenate(std::vector<V>{slice(a, 1, 0, 2), slice(b, 1, 2, 4)}, 1) * a);
    });
    check("split, a part unused", [&](const auto& a, const auto& b) {
        auto parts = split(a * b, std::vector<std::size_t>{1, 2, 1}, 1);
        return sum(parts[0] * parts[0]) + sum(exp(parts[2])) * 2.0;
    });
    check("split, the first part unused", [&](const auto& a, const auto& b) {
        auto parts = split(a * b + a, 2, 1);
        return sum(parts[1] * parts[1]);
    });
    check("layer_norm with gain and bias", [&](const auto& a, const auto& b) {
        return sum(layer_norm(a * b, reduce_sum(b, {0}), reduce_sum(a, {0})) * b);
    });
    check("cast rebalance", [&](const auto& a, const auto& b) { return sum(rebalance_scale(cast<double>(a), 4.0f) * b); });
    check("tanh log_softmax reduce_mean", [&](const auto& a, const auto& b) {
        return sum(tanh(a) * log_softmax(b, 1)) + reduce_mean(a * b) * 5.0;
    });
    check("cross-entropy", [&](const auto& a, const auto& b) { return softmax_cross_entropy(a * b, labels) * 2.0; });
}

TEST_CASE("the same model code runs on ScaledArrays and gives their value", "[autodiff]")
{
    std::mt19937 rng(3);
    const auto a = random_array<float, pow2_scale>(rng, {4, 6}, 0.25f);
    const auto b = random_array<float, pow2_scale>(rng, {6, 3}, 2.0f);
    const auto model = [](const auto& p, const auto& q) { return reduce_sum(relu(matmul(p, q)) * 0.5 - matmul(p, q)); };
    const auto plain = model(a, b);
    const auto [value, grads] = ad::value_and_grad(model, a, b);
    CHECK(value.scale() == plain.scale());
    CHECK(value.data()() == plain.data()());
}

namespace {
template <class A>
struct two_layer {
    A w, b;
    template <class F>
    friend void for_each_parameter(two_layer& self, F&& f)
    {
        f(self.w), f(self.b);
    }
};
}  // namespace

TEST_CASE("gradients map onto parameter structs and containers; sgd updates them", "[autodiff]")
{
    std::mt19937 rng(5);
    using A = ScaledArray<float, pow2_scale>;
    const A x = random_array<float, pow2_scale>(rng, {8, 4}, 1.0f);
    two_layer<A> params{random_array<float, pow2_scale>(rng, {4, 3}, 0.5f), random_array<float, pow2_scale>(rng, {3}, 0.125f)};
    const auto loss = [&](const auto& p) { return reduce_sum(relu(matmul(x, p.w) + p.b)); };
    const auto [value, grads] = ad::value_and_grad<unit_scaling>(loss, params);
    static_assert(std::same_as<std::remove_cvref_t<decltype(grads)>, two_layer<ad::gradient<pow2_scale>>>);
    CHECK(grads.w.shape() == std::vector<std::size_t>{4, 3});
    CHECK(grads.b.shape() == std::vector<std::size_t>{3});

    // The same gradients through a named map and a vector.
    std::map<std::string, A> named{{"w", params.w}, {"b", params.b}};
    const auto by_name = ad::grad<unit_scaling>([&](const auto& p) { return reduce_sum(relu(matmul(x, p.at("w")) + p.at("b"))); }, named);
    CHECK(testing::same_bits(by_name.at("w"), grads.w));
    CHECK(testing::same_bits(by_name.at("b"), grads.b));

    // SGD on float32 masters: w - lr * g, in float, under the parameter's scale.
    const xt::xarray<float> before = params.w.value();
    ad::sgd(0.5).step(params, grads);
    const xt::xarray<float> expected = before - 0.5f * grads.w.value();
    CHECK(xt::allclose(params.w.value(), expected, 1e-6, 1e-6));
    CHECK(params.w.scale() == 0.5f);

    // Low-precision parameters keep their scale and round the update.
    two_layer<ScaledArray<float8_e4m3fn, pow2_scale>> low{cast<float8_e4m3fn>(params.w), cast<float8_e4m3fn>(params.b)};
    const auto low_grads = ad::grad([&](const auto& p) { return reduce_sum(matmul(x, p.w) + p.b); }, low);
    ad::sgd(0.25).step(low, low_grads);
    CHECK(low.w.scale() == 0.5f);
    CHECK_THROWS_AS(ad::sgd(std::nan("")), config_error);
}

TEST_CASE("gradient-path ops act on the cotangent only", "[autodiff]")
{
    std::mt19937 rng(9);
    using A = ScaledArray<float, pow2_scale>;
    const A w = random_array<float, pow2_scale>(rng, {5, 5}, 1.0f);
    const A x = random_array<float, pow2_scale>(rng, {3, 5}, 1.0f);

    // cast_grad: identity forward, the weight gradient arrives in E5M2 at the propagated scale.
    const auto [v1, g1] = ad::value_and_grad([&](const auto& p) { return reduce_sum(cast_grad<float8_e5m2>(p) * 2.0); }, w);
    const auto [v0, g0] = ad::value_and_grad([&](const auto& p) { return reduce_sum(p * 2.0); }, w);
    CHECK(v1.data()() == v0.data()());
    CHECK(g1.holds<float8_e5m2>());
    CHECK(xt::allclose(g1.value(), g0.value()));

    // dynamic_rescale_max_grad: the cotangent's data max becomes ~1, its value is unchanged.
    const auto g2 = ad::grad([&](const auto& p) { return reduce_sum(dynamic_rescale_max_grad(matmul(x, p)) * 1e-6); }, w);
    const auto g3 = ad::grad([&](const auto& p) { return reduce_sum(matmul(x, p) * 1e-6); }, w);
    CHECK(xt::allclose(g2.value(), g3.value(), 1e-5, 1e-12));
    const double data_max = double(xt::amax(xt::abs(g2.as<float>().data()))());
    CHECK(data_max >= 0.5);
    CHECK(data_max <= 2.0);

    // stop_gradient: nothing flows back, so the parameter is not part of the graph.
    CHECK_THROWS_AS(ad::grad([&](const auto& p) { return reduce_sum(stop_gradient(p) * 2.0); }, w), autodiff_error);
}

TEST_CASE("backward rules compute in the output's compute type (docs/ops.md)", "[autodiff]")
{
    std::mt19937 rng(21);
    using A = ScaledArray<float, pow2_scale>;
    const A w = random_array<float, pow2_scale>(rng, {6, 7}, 0.5f);

    // An E5M2 cotangent reaching relu's rule is read in float32; the rule's result is float32,
    // with the E5M2 values where w > 0 and zeros elsewhere.
    const auto through_relu =
        ad::grad([&](const auto& p) { return reduce_sum(cast_grad<float8_e5m2>(relu(p)) * 3.0); }, w);
    const auto direct = ad::grad([&](const auto& p) { return reduce_sum(cast_grad<float8_e5m2>(p) * 3.0); }, w);
    REQUIRE(direct.holds<float8_e5m2>());
    REQUIRE(through_relu.holds<float>());
    // Element loops, not xtensor expressions: on ARM64 (aarch64 g++ 12, xtensor 0.24) the
    // expected array built from xt::eval(xt::cast<float>(w.value() > 0)) came out 4-dimensional.
    const xt::xarray<float> w_value = w.value();
    xt::xarray<float> mask = xt::zeros<float>(w_value.shape());
    for (std::size_t i = 0; i < mask.size(); ++i) mask.flat(i) = w_value.flat(i) > 0.0f ? 1.0f : 0.0f;
    const xt::xarray<float> direct_value = direct.value();
    xt::xarray<float> masked = xt::zeros<float>(w_value.shape());
    for (std::size_t i = 0; i < masked.size(); ++i) masked.flat(i) = direct_value.flat(i) * mask.flat(i);
    CHECK(bool(through_relu.value() == masked));

    // A float64 seed on a float32 output is rounded to float32 before the first rule.
    ad::tape<pow2_scale> tape;
    const auto v = tape.watch(w);
    const auto y = relu(v) * 2.0;
    xt::xarray<double> seed = xt::xarray<double>::from_shape({6, 7});
    seed.fill(1.0 / 3.0);
    tape.backward(y, ScaledArray<double, pow2_scale>(seed, 1.0f));
    REQUIRE(tape.gradient_of(v).holds<float>());
    xt::xarray<float> expected = xt::zeros<float>(w_value.shape());
    for (std::size_t i = 0; i < expected.size(); ++i) expected.flat(i) = 2.0f * float(1.0 / 3.0) * mask.flat(i);
    CHECK(bool(tape.gradient_of(v).value() == expected));

    // A float64 computation keeps float64 cotangents.
    const auto wd = cast<double>(w);
    const auto gd = ad::grad([&](const auto& p) { return reduce_sum(gelu(p) * p); }, wd);
    CHECK(gd.holds<double>());
}

TEST_CASE("a matmul precision scope casts operands and cotangents, and is restored", "[autodiff]")
{
    std::mt19937 rng(13);
    using A = ScaledArray<float, pow2_scale>;
    const A w = random_array<float, pow2_scale>(rng, {16, 8}, 0.25f);
    const A x = random_array<float, pow2_scale>(rng, {4, 16}, 1.0f);
    const auto loss = [&](const auto& p) { return reduce_sum(matmul(x, p) * matmul(x, p)); };
    const auto [exact, g_exact] = ad::value_and_grad<unit_scaling>(loss, w);
    {
        const ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
        CHECK(ad::current_matmul_precision().forward == dtype::float8_e4m3fn);
        const auto [low, g_low] = ad::value_and_grad<unit_scaling>(loss, w);
        // Forward equals the product of the E4M3-cast operands at their scales.
        const auto by_hand = matmul<unit_scaling, float>(cast<float8_e4m3fn, round_nearest_even, saturate_finite>(x),
                                                         cast<float8_e4m3fn, round_nearest_even, saturate_finite>(w));
        const auto direct = reduce_sum<unit_scaling>(mul<unit_scaling>(by_hand, by_hand));
        CHECK(low.data()() == direct.data()());
        CHECK(low.value()() != exact.value()());
        CHECK(xt::allclose(g_low.value(), g_exact.value(), 0.2, 0.2 * double(xt::amax(xt::abs(g_exact.value()))())));
        {
            // The off state, inside a recipe: float32 again, bit for bit, then the recipe back.
            const ad::matmul_precision_scope off(ad::full_precision);
            CHECK(ad::current_matmul_precision() == ad::full_precision);
            const auto [again, g_again] = ad::value_and_grad<unit_scaling>(loss, w);
            CHECK(again.data()() == exact.data()());
            CHECK(bool(g_again.value() == g_exact.value()));
        }
        CHECK(ad::current_matmul_precision() == ad::matmul_precision{dtype::float8_e4m3fn, dtype::float8_e5m2});
    }
    CHECK(ad::current_matmul_precision() == ad::full_precision);
}

namespace {
/// natural_scaling, except that gelu's results are stored at four times their natural scale.
struct gelu_at_four : natural_scaling {};
}  // namespace
template <>
struct scalify::scaling_traits<scalify::ops::gelu, gelu_at_four> {
    template <ScalePolicy Policy>
    [[nodiscard]] static float output_scale(const scale_request& request)
    {
        return Policy::from_rule(4.0f * request.natural);
    }
};

TEST_CASE("runtime_scaling runs the chosen strategy's rules: the bits of naming it directly", "[autodiff]")
{
    std::mt19937 rng(19);
    using A = ScaledArray<float, pow2_scale>;
    const A w = random_array<float, pow2_scale>(rng, {16, 8}, 0.25f);
    const A x = random_array<float, pow2_scale>(rng, {4, 16}, 1.0f);
    const auto loss = [&](const auto& p) { return reduce_mean(layer_norm(gelu(matmul(x, p))) * matmul(x, p)); };
    using rules = runtime_scaling<unit_scaling, natural_scaling, dynamic_abs<float8_e4m3fn>, gelu_at_four>;
    static_assert(ScalingStrategy<rules> && rules::needs_amax && rules::size == 4);
    static_assert(rules::index_of<unit_scaling> == 0 && rules::index_of<gelu_at_four> == 3);
    // Under the fp8 recipe each scale decides which bits the casts keep, so equal bits show that
    // every op and backward rule asked the chosen strategy.
    const ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
    const auto same_bits = [&]<class Direct>(Direct, std::size_t index) {
        const auto [direct, g_direct] = ad::value_and_grad<Direct>(loss, w);
        const rules::scope chosen(index);
        CHECK(rules::current() == index);
        const auto [picked, g_picked] = ad::value_and_grad<rules>(loss, w);
        CHECK(picked.scale() == direct.scale());
        CHECK(picked.data()() == direct.data()());
        CHECK(g_picked.type_name() == g_direct.type_name());
        CHECK(g_picked.scale() == g_direct.scale());
        CHECK(bool(g_picked.value() == g_direct.value()));
        return g_direct.scale();
    };
    const float unit = same_bits(unit_scaling{}, rules::index_of<unit_scaling>);
    const float natural = same_bits(natural_scaling{}, rules::index_of<natural_scaling>);
    same_bits(dynamic_abs<float8_e4m3fn>{}, rules::index_of<dynamic_abs<float8_e4m3fn>>);
    same_bits(gelu_at_four{}, rules::index_of<gelu_at_four>);  // a specialised rule still applies
    CHECK(unit != natural);

    // Outside any scope the first strategy runs; scopes nest and restore; an index past the list
    // is a config_error naming it.
    CHECK(rules::current() == 0);
    {
        const rules::scope outer(1);
        {
            const rules::scope inner(rules::index_of<gelu_at_four>);
            CHECK(rules::current() == 3);
        }
        CHECK(rules::current() == 1);
        CHECK_THROWS_WITH(rules::scope(4), Catch::Contains("strategy index 4 is past the list of 4"));
        CHECK_THROWS_AS(rules::scope(7), config_error);
        CHECK(rules::current() == 1);
    }
    CHECK(rules::current() == 0);
    // Each list has its own choice.
    using other = runtime_scaling<natural_scaling, unit_scaling>;
    const other::scope second(1);
    CHECK(rules::current() == 0);
    CHECK(other::current() == 1);
}

TEST_CASE("misuse of the autodiff layer is a typed error naming what went wrong", "[autodiff]")
{
    std::mt19937 rng(17);
    using A = ScaledArray<float, float_scale>;
    const A w = random_array<float>(rng, {3, 3}, 1.0f);

    SECTION("a value used after its tape is gone")
    {
        ad::var<float> escaped;
        (void)ad::grad([&](const auto& p) {
            escaped = p * 2.0;
            return reduce_sum(p);
        }, w);
        CHECK(!escaped.tape_alive());
        CHECK(escaped.value().scale() == 2.0f);  // the value itself is still readable
        CHECK_THROWS_WITH(ad::grad([&](const auto& p) { return reduce_sum(p + escaped); }, w),
                          Catch::Contains("used after its tape was destroyed"));
    }
    SECTION("a non-scalar output without a seed")
    {
        CHECK_THROWS_WITH(ad::grad([&](const auto& p) { return p * 2.0; }, w), Catch::Contains("scalar"));
        ad::tape<float_scale> tape;
        const auto p = tape.watch(w);
        const auto y = p * 2.0;
        CHECK_THROWS_AS(tape.backward(y), autodiff_error);
        tape.backward(y, A(xt::ones<float>({3, 3}), 1.0f));  // with a seed it works
        CHECK(tape.gradient_of(p).scale() == 2.0f);
        CHECK_THROWS_AS(tape.backward(y, A(xt::ones<float>({2}), 1.0f)), shape_error);
        const auto taken = tape.take_gradient(p);  // moved out: the tape keeps none
        CHECK(taken.scale() == 2.0f);
        CHECK_THROWS_WITH(tape.gradient_of(p), Catch::Contains("gradient was taken"));
    }
    SECTION("a parameter that is not part of the graph")
    {
        const A unused = random_array<float>(rng, {2}, 1.0f);
        CHECK_THROWS_WITH(ad::grad([&](const auto& p, const auto&) { return reduce_sum(p); }, w, unused),
                          Catch::Contains("parameter leaf 2 (shape (2,)) is not part of the graph"));
    }
    SECTION("shape mismatches discovered in backward")
    {
        ad::tape<float_scale> tape;
        const auto p = tape.watch(w);
        const auto bad = ad::custom_op<default_scaling>(p.value(), std::tuple{p}, [](const auto& g) {
            return std::tuple{scalify::slice(g, 0, 0, 1)};  // wrong shape
        });
        CHECK_THROWS_WITH(tape.backward(reduce_sum(bad)), Catch::Contains("cotangent of shape (1, 3)"));
    }
    SECTION("values of two tapes, and empty vars")
    {
        ad::tape<float_scale> t1, t2;
        const auto p1 = t1.watch(w);
        const auto p2 = t2.watch(w);
        CHECK_THROWS_WITH(p1 + p2, Catch::Contains("two different tapes"));
        CHECK_THROWS_AS(ad::var<float>().value(), autodiff_error);
        CHECK_THROWS_AS(t1.gradient_of(p2), autodiff_error);
    }
    SECTION("shape errors of the forward ops still surface")
    {
        CHECK_THROWS_AS(ad::grad([&](const auto& p) { return reduce_sum(matmul(p, A(xt::ones<float>({2, 2}), 1.0f))); }, w),
                        shape_error);
    }
}

TEST_CASE("value_and_grad reads parameters in place; a parameter var that escapes keeps a copy", "[autodiff]")
{
    std::mt19937 rng(23);
    using A = ScaledArray<float, float_scale>;
    ad::var<float> escaped;
    xt::xarray<float> original;
    {
        A w = random_array<float>(rng, {4, 3}, 0.5f);
        original = w.value();
        const auto [value, grads] = ad::value_and_grad(
            [&](const auto& p) {
                CHECK(p.value().data().data() == w.data().data());  // the parameter itself, not a copy
                escaped = p;
                return reduce_sum(p * p);
            },
            w);
        CHECK((grads.template as<float>().value() == xt::xarray<float>(2.0f * original)));
        CHECK(escaped.value().data().data() != w.data().data());  // copied when the tape died
        w = A(xt::zeros<float>({4, 3}), 1.0f);
    }  // w is gone; the escaped var reads its own copy
    CHECK((escaped.value().value() == original));

    A v = random_array<float>(rng, {5}, 2.0f);
    ad::tape<float_scale> tape;
    const auto pv = tape.watch_in_place(v);
    CHECK(pv.value().data().data() == v.data().data());
    tape.backward(reduce_sum(pv * 3.0));
    CHECK((tape.gradient_of(pv).as<float>().value() == xt::xarray<float>(xt::ones<float>({5}) * 3.0f)));
}

TEST_CASE("an op given an expiring var reuses its memory, with the bits of a copy", "[autodiff]")
{
    std::mt19937 rng(29);
    using A = ScaledArray<float, pow2_scale>;
    const A x = random_array<float, pow2_scale>(rng, {2, 3, 4}, 0.25f);
    const A w = random_array<float, pow2_scale>(rng, {4, 6}, 2.0f);
    const A b = random_array<float, pow2_scale>(rng, {6}, 0.5f);
    // Each intermediate named (lvalues: copied), then the same model on temporaries (expiring).
    const auto named = [](const auto& xv, const auto& wv, const auto& bv) {
        const auto product = matmul(xv, wv);
        const auto biased = product + bv;
        const auto reshaped = reshape(biased, {2, 3, 2, 3});
        const auto scaled = reshaped * 0.3;
        const auto masked = causal_mask(scaled);
        const auto shifted = masked - reshaped;  // reshaped read again: it must not be taken
        const auto soft = softmax(reshape(shifted, {6, 6}), 1);
        const auto again = reshape(soft, {36}) + reshape(soft, {36});  // softmax reads its own output
        return reduce_sum(again * reshape(reshaped, {36}));
    };
    const auto expiring = [](const auto& xv, const auto& wv, const auto& bv) {
        auto reshaped = reshape(matmul(xv, wv) + bv, {2, 3, 2, 3});
        auto soft = softmax(reshape(causal_mask(reshaped * 0.3) - reshaped, {6, 6}), 1);
        return reduce_sum((reshape(soft, {36}) + reshape(soft, {36})) * reshape(std::move(reshaped), {36}));
    };
    const auto [value_named, grads_named] = ad::value_and_grad<unit_scaling>(named, x, w, b);
    const auto [value_expiring, grads_expiring] = ad::value_and_grad<unit_scaling>(expiring, x, w, b);
    CHECK(value_named.scale() == value_expiring.scale());
    CHECK((value_named.data() == value_expiring.data()));
    const auto same = [](const auto& g, const auto& h) {
        const auto gv = g.template as<float>(), hv = h.template as<float>();
        CHECK(gv.scale() == hv.scale());
        CHECK((gv.data() == hv.data()));
    };
    same(std::get<0>(grads_named), std::get<0>(grads_expiring));
    same(std::get<1>(grads_named), std::get<1>(grads_expiring));
    same(std::get<2>(grads_named), std::get<2>(grads_expiring));

    // A taken var is left empty; one that something else still holds keeps its value.
    ad::tape<pow2_scale> tape;
    const auto vx = tape.watch<unit_scaling>(x);
    auto y = vx * 2.0;
    const float* y_memory = y.value().data().data();
    auto z = reshape(std::move(y), {24});
    CHECK(y.empty());
    CHECK(z.value().data().data() == y_memory);  // no copy
    auto kept = vx * 2.0;
    const auto other = kept;  // a second holder
    auto copied = reshape(std::move(kept), {24});
    CHECK(other.value().size() == 24);
    CHECK(copied.value().data().data() != other.value().data().data());
    // A parameter is never taken, nor a softmax output (its backward reads it).
    auto from_parameter = reshape(tape.watch<unit_scaling>(w), {24});
    CHECK(from_parameter.value().size() == 24);
    auto soft = softmax(vx, 2);
    const float* soft_memory = soft.value().data().data();
    auto soft_flat = reshape(std::move(soft), {24});
    CHECK(soft_flat.value().data().data() != soft_memory);

    // scalify::add over an expiring operand: the same bits, in its memory.
    A sum_source = random_array<float, pow2_scale>(rng, {3, 4}, 4.0f);
    const A row = random_array<float, pow2_scale>(rng, {4}, 0.125f);
    const A copy_sum = add<unit_scaling>(sum_source, row);
    const float* source_memory = sum_source.data().data();
    const A moved_sum = add<unit_scaling>(std::move(sum_source), row);
    CHECK(moved_sum.data().data() == source_memory);
    CHECK(moved_sum.scale() == copy_sum.scale());
    CHECK((moved_sum.data() == copy_sum.data()));
}

TEST_CASE("a differentiated gelu keeps its derivatives: gelu_vjp's bits, a zero scale included", "[autodiff]")
{
    std::mt19937 rng(41);
    using A = ScaledArray<float, pow2_scale>;
    for (const float scale : {0.0f, 0.25f, 0x1p-30f, 0x1p+20f}) {
        A x = random_array<float, pow2_scale>(rng, {5, 7}, 1.0f);
        x = A(x.data(), scale);
        const A g = random_array<float, pow2_scale>(rng, {5, 7}, 0.5f);
        ad::tape<pow2_scale> tape;
        const auto vx = tape.watch<unit_scaling>(x);
        const auto y = gelu(vx);
        CHECK(y.scale() == gelu<unit_scaling>(x).scale());
        CHECK((y.value().data() == gelu<unit_scaling>(x).data()));
        tape.backward(y, g);
        const A got = tape.gradient_of(vx).as<float>(), want = gelu_vjp<unit_scaling>(g, x);
        INFO("scale " << scale);
        CHECK(got.scale() == want.scale());
        CHECK((got.data() == want.data()));
    }
}

TEST_CASE("custom_op records a user backward rule", "[autodiff]")
{
    std::mt19937 rng(19);
    const auto w = random_array<float>(rng, {4}, 1.0f);
    const auto g = ad::grad(
        [&](const auto& p) {
            const auto cube = ad::custom_op<default_scaling>(
                mul(mul(p.value(), p.value()), p.value()), std::tuple{p},
                [](const auto& gy, const auto& x) { return std::tuple{mul(mul(gy, mul(x, x)), 3.0)}; });
            return reduce_sum(cube);
        },
        w);
    CHECK(xt::allclose(g.value(), 3.0f * w.value() * w.value(), 1e-5, 1e-6));
}
