// The ops of a transformer: matmul over batch dimensions and 1-D operands,
// layer_norm / rms_norm, embedding with its scatter-add gradient, causal_mask and attention.
// Forward values against double references, gradients against central finite differences in
// double, the scale rules, and the errors of bad input.
#include "../support/autodiff_checks.hpp"

#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace scalify;
using scalify::testing::random_array;

// Named, not anonymous: the file joins a unity source with other tests.
namespace transformer_ops_test {

using D = ScaledArray<double, float_scale>;

/// Row-major element (batch t, i, j) of a (..., rows, cols) array broadcast to `batch`.
double at(const D& a, const std::vector<std::size_t>& batch, std::size_t t, std::size_t i, std::size_t j)
{
    const std::size_t rank = a.dimension();
    const std::size_t rows = a.shape()[rank - 2], cols = a.shape()[rank - 1];
    std::size_t index = 0, stride = 1;
    for (std::size_t d = batch.size(); d-- > 0;) {
        const std::size_t coordinate = t % batch[d];
        t /= batch[d];
        if (d + (rank - 2) < batch.size()) break;
        const std::size_t extent = a.shape()[d + (rank - 2) - batch.size()];
        if (extent != 1) index += coordinate * stride;
        stride *= extent;
    }
    return a.data().data()[(index * rows + i) * cols + j] * double(a.scale());
}

/// Central finite differences of f (a scalar function of a vector of vars) against ad::grad.
template <class F>
void check_gradients(const std::string& name, F f, const std::vector<D>& params, double tolerance = 1e-5)
{
    const auto grads = ad::grad(f, params);
    for (std::size_t which = 0; which < params.size(); ++which) {
        const xt::xarray<double> analytic = grads[which].value();
        for (std::size_t i = 0; i < params[which].size(); ++i) {
            auto eval = [&](double delta) {
                std::vector<ad::var<double>> p;
                for (std::size_t j = 0; j < params.size(); ++j) {
                    xt::xarray<double> d = params[j].data();
                    if (j == which) d.data()[i] += delta / double(params[j].scale());
                    p.emplace_back(D(std::move(d), params[j].scale()));
                }
                return double(f(p).value().value()());
            };
            const double fd = (eval(1e-6) - eval(-1e-6)) / 2e-6;
            INFO(name << ": input " << which << " element " << i);
            CHECK(std::abs(fd - analytic.data()[i]) <= tolerance * std::max(1.0, std::abs(fd)));
        }
    }
}

/// A fixed weighting of every output element, so the scalar loss depends on each.
template <class V>
auto weighted_sum(const V& v)
{
    xt::xarray<double> w = xt::xarray<double>::from_shape(std::vector<std::size_t>(v.shape().begin(), v.shape().end()));
    for (std::size_t i = 0; i < w.size(); ++i) w.data()[i] = std::sin(1.0 + 0.7 * double(i));
    return reduce_sum(v * D(std::move(w), 1.0f));
}

}  // namespace transformer_ops_test

using namespace transformer_ops_test;

TEST_CASE("matmul over batch dimensions and 1-D operands equals numpy's matmul", "[transformer]")
{
    std::mt19937 rng(21);
    struct shapes {
        std::vector<std::size_t> a, b, out;
    };
    const std::vector<shapes> cases{
        {{2, 3, 4}, {2, 4, 5}, {2, 3, 5}},       {{2, 3, 4}, {4, 5}, {2, 3, 5}},    {{3, 4}, {2, 4, 5}, {2, 3, 5}},
        {{2, 1, 3, 4}, {3, 4, 2}, {2, 3, 3, 2}}, {{4}, {2, 4, 5}, {2, 5}},          {{2, 3, 4}, {4}, {2, 3}},
        {{4}, {4}, {}},                          {{1, 3, 4}, {2, 4, 5}, {2, 3, 5}}, {{4}, {4, 5}, {5}},
    };
    for (const auto& c : cases) {
        const D a = random_array<double>(rng, c.a, 0.5f);
        const D b = random_array<double>(rng, c.b, 4.0f);
        const auto y = matmul<natural_scaling>(a, b);
        INFO("shapes " << shape_string(c.a) << " x " << shape_string(c.b));
        REQUIRE(std::vector<std::size_t>(y.shape().begin(), y.shape().end()) == c.out);
        CHECK(y.scale() == 2.0f);
        // The reference with both operands promoted to matrices.
        const D a2 = c.a.size() == 1 ? reshape(a, {1, c.a[0]}) : a;
        const D b2 = c.b.size() == 1 ? reshape(b, {c.b[0], 1}) : b;
        std::vector<std::size_t> batch(c.out.begin(), c.out.end() - (c.a.size() == 1 ? 0 : 1) - (c.b.size() == 1 ? 0 : 1));
        std::size_t batches = 1;
        for (auto e : batch) batches *= e;
        const std::size_t m = a2.shape()[a2.dimension() - 2], k = a2.shape()[a2.dimension() - 1], n = b2.shape()[b2.dimension() - 1];
        for (std::size_t t = 0; t < batches; ++t) {
            for (std::size_t i = 0; i < m; ++i) {
                for (std::size_t j = 0; j < n; ++j) {
                    double sum = 0;
                    for (std::size_t l = 0; l < k; ++l) sum += at(a2, batch, t, i, l) * at(b2, batch, t, l, j);
                    CHECK(y.data().data()[(t * m + i) * n + j] * double(y.scale()) == Approx(sum).epsilon(1e-12));
                }
            }
        }
    }
}

TEST_CASE("batched matmul: one scale from the 2-D rule, and each batch bit for bit a 2-D product", "[transformer]")
{
    std::mt19937 rng(22);
    using F = ScaledArray<float, pow2_scale>;
    const F a = random_array<float, pow2_scale>(rng, {3, 5, 16}, 0.25f);
    const F b = random_array<float, pow2_scale>(rng, {3, 16, 7}, 2.0f);
    const auto batched = matmul<unit_scaling>(a, b);
    const auto dynamic = matmul<dynamic_abs<float8_e4m3fn>>(a, b);
    float amax = 0;
    for (std::size_t t = 0; t < 3; ++t) {
        const auto one = matmul<unit_scaling>(reshape(slice(a, 0, t, t + 1), {5, 16}), reshape(slice(b, 0, t, t + 1), {16, 7}));
        CHECK(one.scale() == batched.scale());  // sqrt(K) rule, K = 16: 0.5 * 4
        for (std::size_t i = 0; i < 35; ++i) {
            CHECK(one.data().data()[i] == batched.data().data()[t * 35 + i]);
            amax = std::max(amax, std::abs(one.data().data()[i] * one.scale()));
        }
    }
    CHECK(batched.scale() == 2.0f);
    // dynamic_abs sees the amax of the whole result: one scale for every batch.
    CHECK(dynamic.scale() == pow2_round_up(amax / 448.0f));

    // fp8 operands under the H100 accumulation model: each batch as the 2-D model computes it.
    using E = ScaledArray<float8_e4m3fn, pow2_scale>;
    const E a8 = cast<float8_e4m3fn, round_nearest_even, saturate_finite>(a);
    const E b8 = cast<float8_e4m3fn, round_nearest_even, saturate_finite>(b);
    const auto modelled = matmul<natural_scaling, float>(a8, b8, tensor_core::h100_cublaslt_fp8{});
    tensor_core::accumulation_scope<> scope("h100");
    const auto scoped = matmul<natural_scaling, float>(a8, b8);
    for (std::size_t t = 0; t < 3; ++t) {
        const auto one = matmul<natural_scaling, float>(reshape(slice(a8, 0, t, t + 1), {5, 16}),
                                                        reshape(slice(b8, 0, t, t + 1), {16, 7}), tensor_core::h100_cublaslt_fp8{});
        for (std::size_t i = 0; i < 35; ++i) {
            CHECK(one.data().data()[i] == modelled.data().data()[t * 35 + i]);
            CHECK(one.data().data()[i] == scoped.data().data()[t * 35 + i]);
        }
    }
}

TEST_CASE("matmul's errors name both shapes", "[transformer]")
{
    const D a(xt::xarray<double>::from_shape({2, 3, 4}), 1.0f);
    const D b(xt::xarray<double>::from_shape({3, 5, 6}), 1.0f);
    const D c(xt::xarray<double>::from_shape({4, 4, 6}), 1.0f);
    const D scalar(xt::xarray<double>::from_shape({}), 1.0f);
    CHECK_THROWS_WITH(matmul(a, b), Catch::Contains("(2, 3, 4)") && Catch::Contains("(3, 5, 6)") && Catch::Contains("inner"));
    CHECK_THROWS_WITH(matmul(a, c), Catch::Contains("batch dimensions do not broadcast"));
    CHECK_THROWS_AS(matmul(scalar, a), shape_error);
}

TEST_CASE("batched matmul's gradients match finite differences", "[transformer]")
{
    std::mt19937 rng(23);
    const std::vector<std::pair<std::vector<std::size_t>, std::vector<std::size_t>>> cases{
        {{2, 3, 4}, {2, 4, 5}}, {{2, 3, 4}, {4, 5}}, {{3, 4}, {2, 4, 5}}, {{2, 1, 3, 4}, {3, 4, 2}}, {{4}, {2, 4, 5}},
        {{2, 3, 4}, {4}},       {{4}, {4}},          {{1, 3, 4}, {2, 4, 5}}};
    for (const auto& [sa, sb] : cases) {
        const std::vector<D> params{random_array<double>(rng, sa, 0.5f), random_array<double>(rng, sb, 2.0f)};
        check_gradients(shape_string(sa) + " x " + shape_string(sb),
                        [](const auto& p) { return weighted_sum(matmul(p[0], p[1])); }, params);
    }
    // The gradients read the operands transposed in place: the bits of the products of the
    // swapped copies, g.b^T and a^T.g, summed back over broadcast batches.
    using F = ScaledArray<float, pow2_scale>;
    for (const auto& [sa, sb] : std::vector<std::pair<std::vector<std::size_t>, std::vector<std::size_t>>>{
             {{2, 3, 17, 9}, {2, 3, 9, 12}}, {{3, 17, 9}, {1, 9, 12}}, {{1, 17, 9}, {3, 9, 12}}}) {
        const F a = random_array<float, pow2_scale>(rng, sa, 0.5f), b = random_array<float, pow2_scale>(rng, sb, 2.0f);
        const F product = matmul<unit_scaling>(a, b);
        const F g = random_array<float, pow2_scale>(rng, std::vector<std::size_t>(product.shape().begin(), product.shape().end()), 4.0f);
        const auto [ga, gb] = matmul_vjp<unit_scaling>(g, a, b);
        const auto swapped = [](const F& x) { return detail::swap_last_axes(x); };
        const F want_a = detail::unbroadcast<unit_scaling>(matmul<unit_scaling>(g, swapped(b)), a.shape());
        const F want_b = detail::unbroadcast<unit_scaling>(matmul<unit_scaling>(swapped(a), g), b.shape());
        CHECK(ga.scale() == want_a.scale());
        CHECK((ga.data() == want_a.data()));
        CHECK(gb.scale() == want_b.scale());
        CHECK((gb.data() == want_b.data()));
    }
}

TEST_CASE("layer_norm and rms_norm: values, scale invariance, unit output scale", "[transformer]")
{
    std::mt19937 rng(24);
    const D x = random_array<double>(rng, {3, 2, 8}, 1.0f);
    const auto ln = layer_norm<unit_scaling>(x);
    const auto rn = rms_norm<unit_scaling>(x);
    CHECK(ln.scale() == 1.0f);
    CHECK(rn.scale() == 1.0f);
    for (std::size_t lane = 0; lane < 6; ++lane) {
        double mean = 0, squares = 0, sq = 0;
        for (std::size_t i = 0; i < 8; ++i) mean += x.data().data()[lane * 8 + i] / 8;
        for (std::size_t i = 0; i < 8; ++i) {
            const double v = x.data().data()[lane * 8 + i];
            squares += (v - mean) * (v - mean) / 8;
            sq += v * v / 8;
        }
        for (std::size_t i = 0; i < 8; ++i) {
            const double v = x.data().data()[lane * 8 + i];
            CHECK(ln.data().data()[lane * 8 + i] == Approx((v - mean) / std::sqrt(squares + 1e-5)).epsilon(1e-12));
            CHECK(rn.data().data()[lane * 8 + i] == Approx(v / std::sqrt(sq + 1e-6)).epsilon(1e-12));
        }
    }
    // The statistics are the data's: an input at 2^-60 or 2^60 (whose value-domain sum of squares
    // would underflow or overflow float32) normalises alike (eps scales with it).
    using F = ScaledArray<float, pow2_scale>;
    const F xf = random_array<float, pow2_scale>(rng, {4, 64}, 1.0f);
    const auto reference = layer_norm<unit_scaling>(xf, 0.0);
    for (const float scale : {std::ldexp(1.0f, -60), std::ldexp(1.0f, 60)}) {
        const auto y = layer_norm<unit_scaling>(F(xf.data(), scale), 0.0);
        CHECK(y.scale() == 1.0f);
        CHECK(y.data() == reference.data());
    }
    // A zero-scale input is zeros: zero output, and gradient (g - mean g) / sqrt(eps).
    const auto zero = layer_norm(D(x.data(), 0.0f));
    CHECK(xt::all(xt::equal(zero.value(), 0.0)));
    const D g = random_array<double>(rng, {3, 2, 8}, 1.0f);
    const auto gz = layer_norm_vjp(g, D(x.data(), 0.0f), 1e-4);
    double g_mean = 0;
    for (std::size_t i = 0; i < 8; ++i) g_mean += g.data().data()[i] / 8;
    CHECK(gz.value().data()[0] == Approx((g.data().data()[0] - g_mean) / 1e-2).epsilon(1e-12));
    CHECK_THROWS_AS(layer_norm(x, -1.0), config_error);
    CHECK_THROWS_AS(rms_norm(D(xt::xarray<double>::from_shape({}), 1.0f)), shape_error);
    CHECK_THROWS_WITH(layer_norm_vjp(random_array<double>(rng, {3, 8}, 1.0f), x), Catch::Contains("(3, 8)"));
}

TEST_CASE("layer_norm and rms_norm gradients match finite differences; unit_scaling keeps them unit", "[transformer]")
{
    std::mt19937 rng(25);
    const std::vector<D> params{random_array<double>(rng, {2, 3, 6}, 0.25f)};
    check_gradients("layer_norm", [](const auto& p) { return weighted_sum(layer_norm(p[0], 1e-3)); }, params);
    check_gradients("rms_norm", [](const auto& p) { return weighted_sum(rms_norm(p[0], 1e-3)); }, params);
    // Unit-normal data at scale s_x, unit-normal cotangent at scale s_g: the gradient's data come
    // out at unit RMS (within sampling error) and its scale carries s_g / s_x.
    using F = ScaledArray<float, pow2_scale>;
    const F x = random_array<float, pow2_scale>(rng, {256, 128}, 8.0f);
    const F g = random_array<float, pow2_scale>(rng, {256, 128}, 0.25f);
    for (const auto& gx : {layer_norm_vjp<unit_scaling>(g, x), rms_norm_vjp<unit_scaling>(g, x)}) {
        double squares = 0;
        for (const float v : gx.data()) squares += double(v) * v;
        CHECK(std::sqrt(squares / double(gx.size())) == Approx(1.0).epsilon(0.05));
        CHECK(gx.scale() == 0.03125f);
    }
}

TEST_CASE("embedding gathers rows; its gradient scatter-adds, repeated ids summed", "[transformer]")
{
    std::mt19937 rng(26);
    const D table = random_array<double>(rng, {5, 3}, 0.5f);
    const xt::xarray<int> ids = {{0, 4, 4}, {2, 0, 4}};
    const auto rows = embedding(table, ids);
    REQUIRE(rows.dimension() == 3);
    CHECK(rows.scale() == 0.5f);
    for (std::size_t i = 0; i < 6; ++i) {
        for (std::size_t j = 0; j < 3; ++j) CHECK(rows.data().data()[i * 3 + j] == table.data()(ids.data()[i], j));
    }
    check_gradients("embedding", [&](const auto& p) { return weighted_sum(embedding(p[0], ids)); }, {table});
    // Row 1 and row 3 are never looked up: zero gradient.
    const auto grads = ad::grad([&](const auto& t) { return weighted_sum(embedding(t, ids)); }, table);
    for (std::size_t j = 0; j < 3; ++j) {
        CHECK(grads.value()(1, j) == 0.0);
        CHECK(grads.value()(3, j) == 0.0);
    }
    // unit_scaling: 4096 unit rows into 64 rows: RMS sqrt(64) in the scale, data near unit.
    using F = ScaledArray<float, pow2_scale>;
    const F g = random_array<float, pow2_scale>(rng, {4096, 16}, 1.0f);
    xt::xarray<std::int64_t> many = xt::xarray<std::int64_t>::from_shape({4096});
    for (std::size_t i = 0; i < 4096; ++i) many(i) = static_cast<std::int64_t>((i * 37) % 64);
    const auto gt = embedding_vjp<unit_scaling>(g, many, 64);
    CHECK(gt.scale() == 8.0f);
    CHECK_THROWS_WITH(embedding(table, xt::xarray<int>{1, 5}), Catch::Contains("id 5") && Catch::Contains("5 rows"));
    CHECK_THROWS_AS(embedding(table, xt::xarray<int>{-1}), index_error);
    CHECK_THROWS_AS(embedding(random_array<double>(rng, {5}, 1.0f), ids), shape_error);
}

TEST_CASE("causal_mask hides the future from softmax, at any scale", "[transformer]")
{
    std::mt19937 rng(27);
    using F = ScaledArray<float, pow2_scale>;
    const F scores = random_array<float, pow2_scale>(rng, {2, 4, 4}, 0.5f);
    const auto masked = causal_mask(scores);
    CHECK(masked.scale() == 0.5f);
    const auto p = softmax(masked, 2).value();
    for (std::size_t b = 0; b < 2; ++b) {
        for (std::size_t i = 0; i < 4; ++i) {
            double total = 0;
            for (std::size_t j = 0; j < 4; ++j) {
                if (j > i) CHECK(p(b, i, j) == 0.0f);
                total += p(b, i, j);
            }
            CHECK(total == Approx(1.0).epsilon(1e-6));
        }
    }
    // A zero-scale input keeps its mask (scale 1, zero data): uniform over the past only.
    const auto zero = softmax(causal_mask(F(scores.data(), 0.0f)), 2).value();
    CHECK(zero(0, 1, 0) == 0.5f);
    CHECK(zero(0, 1, 2) == 0.0f);
    // More keys than queries: query i still sees keys 0..i (PyTorch's is_causal alignment).
    const auto wide = causal_mask(random_array<float, pow2_scale>(rng, {2, 3}, 1.0f)).value();
    CHECK(std::isinf(wide(0, 1)));
    CHECK(std::isfinite(wide(1, 1)));
    CHECK(std::isinf(wide(1, 2)));
    CHECK_THROWS_AS(causal_mask(random_array<float, pow2_scale>(rng, {3}, 1.0f)), shape_error);
    const std::vector<D> params{random_array<double>(rng, {2, 3, 3}, 1.0f)};
    check_gradients("causal_mask softmax", [](const auto& q) { return weighted_sum(softmax(causal_mask(q[0]), 2)); }, params);
}

TEST_CASE("attention equals softmax(q k^T / sqrt(d) + mask) v; its gradients match finite differences", "[transformer]")
{
    std::mt19937 rng(28);
    const std::size_t heads = 2, t = 4, d = 3;
    const D q = random_array<double>(rng, {heads, t, d}, 0.5f);
    const D k = random_array<double>(rng, {heads, t, d}, 1.0f);
    const D v = random_array<double>(rng, {heads, t, d}, 2.0f);
    for (const bool causal : {false, true}) {
        const auto out = attention<unit_scaling>(q, k, v, causal).value();
        for (std::size_t h = 0; h < heads; ++h) {
            for (std::size_t i = 0; i < t; ++i) {
                std::vector<double> w(t, 0.0);
                double top = -std::numeric_limits<double>::infinity(), total = 0;
                for (std::size_t j = 0; j < t; ++j) {
                    double dot = 0;
                    for (std::size_t c = 0; c < d; ++c) dot += q.value()(h, i, c) * k.value()(h, j, c);
                    w[j] = (causal && j > i) ? -std::numeric_limits<double>::infinity() : dot / std::sqrt(double(d));
                    top = std::max(top, w[j]);
                }
                for (auto& e : w) total += (e = std::exp(e - top));
                for (std::size_t c = 0; c < d; ++c) {
                    double expected = 0;
                    for (std::size_t j = 0; j < t; ++j) expected += w[j] / total * v.value()(h, j, c);
                    CHECK(out(h, i, c) == Approx(expected).epsilon(1e-6));  // float32 scales (1/sqrt(d))
                }
            }
        }
        check_gradients(causal ? "causal attention" : "attention",
                        [causal](const auto& p) { return weighted_sum(attention(p[0], p[1], p[2], causal)); }, {q, k, v});
    }
}

TEST_CASE("a tiny transformer block in fp8 under the recipe: finite, close to float32", "[transformer]")
{
    std::mt19937 rng(29);
    using F = ScaledArray<float, pow2_scale>;
    const std::size_t batch = 2, t = 8, width = 16, vocabulary = 11;
    const F table = random_array<float, pow2_scale>(rng, {vocabulary, width}, 1.0f);
    const F w_qkv = random_array<float, pow2_scale>(rng, {width, 3 * width}, 0.25f);
    const F w_out = random_array<float, pow2_scale>(rng, {width, vocabulary}, 0.25f);
    xt::xarray<int> ids = xt::xarray<int>::from_shape({batch, t});
    std::vector<int> targets(batch * t);
    for (std::size_t i = 0; i < ids.size(); ++i) {
        ids.data()[i] = static_cast<int>((i * 7) % vocabulary);
        targets[i] = static_cast<int>((i * 3 + 1) % vocabulary);
    }
    const auto loss = [&](const auto& p) {
        const auto x = embedding(p[0], ids);
        const auto qkv = matmul(layer_norm(x), p[1]);
        const auto split = [&](std::size_t part) { return slice(qkv, 2, part * width, (part + 1) * width); };
        const auto h = x + attention(split(0), split(1), split(2), true);
        const auto logits = matmul(rms_norm(h), p[2]);
        return softmax_cross_entropy(dynamic_rescale_l2_grad(reshape(logits, {batch * t, vocabulary})), targets);
    };
    const std::vector<F> params{table, w_qkv, w_out};
    const auto [reference, exact] = ad::value_and_grad<unit_scaling>(loss, params);
    ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
    const auto [value, grads] = ad::value_and_grad<unit_scaling>(loss, params);
    CHECK(value.value()() == Approx(reference.value()()).epsilon(0.05));
    for (std::size_t which = 0; which < params.size(); ++which) {
        const xt::xarray<float> g = grads[which].value(), r = exact[which].value();
        double diff = 0, norm = 0;
        for (std::size_t i = 0; i < g.size(); ++i) {
            REQUIRE(std::isfinite(g.data()[i]));
            diff += double(g.data()[i] - r.data()[i]) * (g.data()[i] - r.data()[i]);
            norm += double(r.data()[i]) * r.data()[i];
        }
        INFO("parameter " << which);
        CHECK(std::sqrt(diff / norm) < 0.2);  // fp8 operands (3 mantissa bits) and e5m2 cotangents
    }
}

namespace transformer_ops_test {

template <class A>
bool same_array(const A& x, const A& y)
{
    return x.scale() == y.scale() && x.shape() == y.shape() &&
           std::memcmp(x.data().data(), y.data().data(), x.size() * sizeof(typename A::value_type)) == 0;
}

/// layer_norm(x, gain, bias) against layer_norm(x) * gain + bias under Strategy: the value, and
/// the three gradients through value_and_grad, bit for bit.
template <class Strategy, class A>
void check_fused_layer_norm(const A& x, const A& gain, const A& bias, const A& weights)
{
    CHECK(same_array(layer_norm<Strategy>(x, gain, bias), add<Strategy>(mul<Strategy>(layer_norm<Strategy>(x), gain), bias)));
    const std::vector<A> params{x, gain, bias};
    // A loss whose cotangent differs from element to element.
    const auto fused = [&](const auto& p) { return reduce_sum(layer_norm(p[0], p[1], p[2]) * weights); };
    const auto composed = [&](const auto& p) { return reduce_sum((layer_norm(p[0]) * p[1] + p[2]) * weights); };
    const auto [value, grads] = ad::value_and_grad<Strategy>(fused, params);
    const auto [composed_value, composed_grads] = ad::value_and_grad<Strategy>(composed, params);
    CHECK(same_array(value, composed_value));
    for (std::size_t i = 0; i < 3; ++i) {
        INFO("parameter " << i);
        REQUIRE(grads[i].type_name() == composed_grads[i].type_name());
        CHECK(same_array(std::get<A>(grads[i].variant()), std::get<A>(composed_grads[i].variant())));
    }
}

}  // namespace transformer_ops_test

TEST_CASE("layer_norm with gain and bias: one op, the composition's bits and scales", "[transformer]")
{
    std::mt19937 rng(41);
    using F = ScaledArray<float, pow2_scale>;
    const F x = random_array<float, pow2_scale>(rng, {3, 5, 16}, 8.0f);
    const F gain = random_array<float, pow2_scale>(rng, {16}, 0.5f);
    const F bias = random_array<float, pow2_scale>(rng, {16}, 0.03125f);
    const F weights = random_array<float, pow2_scale>(rng, {3, 5, 16}, 1.0f);
    check_fused_layer_norm<natural_scaling>(x, gain, bias, weights);
    check_fused_layer_norm<unit_scaling>(x, gain, bias, weights);
    check_fused_layer_norm<default_scaling>(x, gain, bias, weights);
    // One lane (a 1-D x): the bias's cotangent is the cotangent itself.
    check_fused_layer_norm<unit_scaling>(random_array<float, pow2_scale>(rng, {16}, 2.0f), gain, bias,
                                         random_array<float, pow2_scale>(rng, {16}, 1.0f));
    // A bias at a larger scale than the product: the product rescaled into the sum.
    check_fused_layer_norm<natural_scaling>(x, gain, F(bias.data(), 64.0f), weights);
    // float32 scales that are not powers of two, and float64.
    check_fused_layer_norm<unit_scaling>(random_array<float, float_scale>(rng, {4, 8}, 3.0f), random_array<float, float_scale>(rng, {8}, 0.7f),
                                         random_array<float, float_scale>(rng, {8}, 0.3f), random_array<float, float_scale>(rng, {4, 8}, 1.5f));
    check_fused_layer_norm<natural_scaling>(D(random_array<double, float_scale>(rng, {6, 8}, 1.0f)), random_array<double, float_scale>(rng, {8}, 2.0f),
                                            random_array<double, float_scale>(rng, {8}, 0.25f), random_array<double, float_scale>(rng, {6, 8}, 1.0f));
    // The composition's own cases: a zero-scale bias or x, a (1, N) gain, a strategy that needs the amax.
    check_fused_layer_norm<natural_scaling>(x, gain, F(bias.data(), 0.0f), weights);
    check_fused_layer_norm<natural_scaling>(F(x.data(), 0.0f), gain, bias, weights);
    CHECK(same_array(layer_norm<natural_scaling>(x, reshape(gain, {1, 16}), bias), add<natural_scaling>(mul<natural_scaling>(layer_norm<natural_scaling>(x), reshape(gain, {1, 16})), bias)));
    CHECK(same_array(layer_norm<dynamic_abs<float8_e4m3fn>>(x, gain, bias),
                     add<dynamic_abs<float8_e4m3fn>>(mul<dynamic_abs<float8_e4m3fn>>(layer_norm<dynamic_abs<float8_e4m3fn>>(x), gain), bias)));
    // One tape node where the composition records three; errors as layer_norm's.
    CHECK(ad::inspect<natural_scaling>([&](const auto& p) { return reduce_sum(layer_norm(p[0], p[1], p[2])); }, std::vector<F>{x, gain, bias})
              .report.ops_named("layer_norm")
              .front()
              ->inputs.size() == 3);
    CHECK_THROWS_WITH(layer_norm(x, gain, bias, -1.0), Catch::Matchers::Contains("eps must be finite and >= 0, got -1"));
    CHECK_THROWS_AS(layer_norm(x, random_array<float, pow2_scale>(rng, {7}, 1.0f), bias), shape_error);
}

TEST_CASE("split: slices forward, one joined cotangent backward", "[transformer]")
{
    std::mt19937 rng(37);
    using F = ScaledArray<float, pow2_scale>;
    const F x = random_array<float, pow2_scale>(rng, {3, 2, 12}, 0.5f);
    const F w = random_array<float, pow2_scale>(rng, {4, 5}, 0.25f);

    // Forward: the slices, scale kept; a ScaledArray model gets the same parts.
    const auto parts = split(x, 3, 2);
    REQUIRE(parts.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(parts[i].scale() == x.scale());
        CHECK(bool(parts[i].data() == slice(x, 2, 4 * i, 4 * (i + 1)).data()));
    }
    CHECK(split(x, std::vector<std::size_t>{2, 1}, 0)[1].shape()[0] == 1);
    CHECK_THROWS_WITH(split(x, 5, 2), Catch::Matchers::Contains("5 equal sections do not divide extent 12 of axis 2"));
    CHECK_THROWS_WITH(split(x, 0, 2), Catch::Matchers::Contains("0 equal sections"));
    CHECK_THROWS_WITH(split(x, 2, 3), Catch::Matchers::Contains("axis 3 out of range for shape (3, 2, 12)"));
    CHECK_THROWS_WITH(split(x, std::vector<std::size_t>{5, 6}, 2), Catch::Matchers::Contains("part extents (5, 6) along axis 2 do not make up shape (3, 2, 12)"));

    // Backward under natural scaling (pow2 scales rescale exactly): the same bits as the three
    // slices' zero-padded cotangents summed; each part's cotangent at its own scale.
    const auto with_split = [&](const auto& p) {
        auto qkv = split(p * 3.0, 3, 2);
        return reduce_sum(matmul(qkv[0], w) * 4.0 + matmul(qkv[1] * 0.125, w) + matmul(qkv[2], w) * matmul(qkv[0], w));
    };
    const auto with_slices = [&](const auto& p) {
        const auto y = p * 3.0;
        const auto part = [&](std::size_t i) { return slice(y, 2, 4 * i, 4 * (i + 1)); };
        return reduce_sum(matmul(part(0), w) * 4.0 + matmul(part(1) * 0.125, w) + matmul(part(2), w) * matmul(part(0), w));
    };
    const auto [value, grad] = ad::value_and_grad<natural_scaling>(with_split, x);
    const auto [slices_value, slices_grad] = ad::value_and_grad<natural_scaling>(with_slices, x);
    CHECK(value.data()() == slices_value.data()());
    CHECK(grad.value().shape() == slices_grad.value().shape());
    CHECK(bool(grad.value() == slices_grad.value()));

    // An inspection sees the three parts as ops of their input.
    const auto inspected = ad::inspect<natural_scaling>(with_split, x);
    REQUIRE(inspected.report.ops_named("split").size() == 3);
    CHECK(inspected.report.ops_named("split")[0]->inputs == std::vector<std::string>{"#1"});  // p * 3

    // Under unit scaling the joined cotangent's scale is concatenate's (an RMS over the parts'
    // elements), the value the same to rounding.
    const auto [unit_value, unit_grad] = ad::value_and_grad<unit_scaling>(with_split, x);
    const xt::xarray<float> g = unit_grad.value(), r = slices_grad.value();
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g.flat(i) == Approx(r.flat(i)).epsilon(1e-5));

    // Only some parts reached: zeros elsewhere; a second sweep on one tape adds up.
    ad::tape<pow2_scale> tape;
    const auto v = tape.watch<natural_scaling>(x);
    const auto only = split(v, 3, 2);
    const auto out = reduce_sum(only[1] * 2.0);
    tape.backward(out);
    tape.backward(out);
    const xt::xarray<float> twice = tape.gradient_of(v).value();
    for (std::size_t i = 0; i < twice.size(); ++i) {
        const std::size_t along = i % 12;
        CHECK(twice.flat(i) == (along >= 4 && along < 8 ? 4.0f : 0.0f));
    }
}

TEST_CASE("linear adds the bias inside the GEMM: add(matmul)'s scale, one rounding, the same gradients", "[transformer]")
{
    std::mt19937 rng(31);
    using F = ScaledArray<float, pow2_scale>;
    const F x = random_array<float, pow2_scale>(rng, {3, 5, 8}, 0.5f);
    const F w = random_array<float, pow2_scale>(rng, {8, 6}, 0.125f);
    const F b = random_array<float, pow2_scale>(rng, {6}, 0.25f);
    const auto close = [](const F& got, const F& want) {
        REQUIRE(got.scale() == want.scale());
        REQUIRE((got.shape() == want.shape()));
        const auto g = got.value(), r = want.value();
        for (std::size_t i = 0; i < g.size(); ++i) {
            // the composition rounds the product and then the sum: two half-ulps apart at most
            CHECK(std::abs(g.data()[i] - r.data()[i]) <= 2e-7f * (std::abs(r.data()[i]) + 1.0f));
        }
    };
    close(linear<unit_scaling>(x, w, b), add<unit_scaling>(matmul<unit_scaling>(x, w), b));
    close(linear<default_scaling>(x, w, b), add<default_scaling>(matmul<default_scaling>(x, w), b));
    close(linear<natural_scaling>(x, w, b), add<natural_scaling>(matmul<natural_scaling>(x, w), b));
    // Small integers: every rounding is exact, so the one-rounding form has the composition's bits.
    F xi = x, wi = w, bi = b;
    {
        xt::xarray<float> d = xt::round(x.data() * 4.0f), e = xt::round(w.data() * 4.0f), f = xt::round(b.data() * 4.0f);
        xi = F(d, 1.0f), wi = F(e, 2.0f), bi = F(f, 4.0f);
    }
    const F exact = linear<natural_scaling>(xi, wi, bi), composed = add<natural_scaling>(matmul<natural_scaling>(xi, wi), bi);
    CHECK(exact.scale() == composed.scale());
    CHECK((exact.data() == composed.data()));
    // Where the bias cannot enter the GEMM: the composition's bits. A bias that is not a row, a
    // dynamic (amax) strategy, a tensor-core accumulation model.
    const F full_bias = random_array<float, pow2_scale>(rng, {5, 6}, 0.25f);
    const auto same = [](const auto& got, const auto& want) {
        CHECK(got.scale() == want.scale());
        CHECK((got.data() == want.data()));
    };
    same(linear<unit_scaling>(x, w, full_bias), add<unit_scaling>(matmul<unit_scaling>(x, w), full_bias));
    same(linear<dynamic_abs<float8_e4m3fn>>(x, w, b),
         add<dynamic_abs<float8_e4m3fn>>(matmul<dynamic_abs<float8_e4m3fn>>(x, w), b));
    {
        const tensor_core::accumulation_scope<> h100("h100");
        same(linear<unit_scaling>(x, w, b), add<unit_scaling>(matmul<unit_scaling>(x, w), b));
    }
    CHECK_THROWS_AS(linear(x, random_array<float, pow2_scale>(rng, {7, 6}, 1.0f), b), shape_error);

    // Differentiated: the cotangent reaching the product is the same, so every gradient has the
    // composition's bits (the loss weights r make the cotangent independent of the forward value),
    // in float32 and under the fp8 recipe.
    const F r = random_array<float, pow2_scale>(rng, {3, 5, 6}, 1.0f);
    const auto fused = [&](const auto& p) { return reduce_sum(linear(p[0], p[1], p[2]) * r); };
    const auto composed_loss = [&](const auto& p) { return reduce_sum((matmul(p[0], p[1]) + p[2]) * r); };
    const std::vector<F> params{x, w, b};
    for (const bool fp8 : {false, true}) {
        std::optional<ad::matmul_precision_scope> recipe;
        if (fp8) recipe.emplace(dtype::float8_e4m3fn, dtype::float8_e5m2);
        const auto [value, grads] = ad::value_and_grad<unit_scaling>(fused, params);
        const auto [value_composed, grads_composed] = ad::value_and_grad<unit_scaling>(composed_loss, params);
        CHECK(value.value()() == Approx(value_composed.value()()).epsilon(1e-5));
        for (std::size_t which = 0; which < params.size(); ++which) {
            INFO("fp8 " << fp8 << ", parameter " << which);
            const auto g = grads[which].as<float>(), h = grads_composed[which].as<float>();
            CHECK(g.scale() == h.scale());
            CHECK((g.data() == h.data()));
        }
    }
    // An inspection names the op and reports the recipe's casts of x and w.
    const ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
    const auto inspected = ad::inspect<unit_scaling>(fused, params);
    bool seen = false;
    for (const auto& op : inspected.report.ops) {
        if (op.op != "linear") continue;
        seen = true;
        CHECK(op.casts.size() == 3);  // x and w to e4m3, the cotangent to e5m2
    }
    CHECK(seen);
}

TEST_CASE("attention reads k transposed in place: the bits of matmul(q, transpose(k)), values and gradients", "[transformer]")
{
    std::mt19937 rng(37);
    using F = ScaledArray<float, pow2_scale>;
    for (const auto& [sq, sk] : std::vector<std::pair<std::vector<std::size_t>, std::vector<std::size_t>>>{
             {{2, 3, 16, 8}, {2, 3, 16, 8}}, {{2, 3, 70, 8}, {1, 3, 70, 8}}, {{5, 8}, {5, 8}}}) {
        const std::vector<F> params{random_array<float, pow2_scale>(rng, sq, 0.5f), random_array<float, pow2_scale>(rng, sk, 2.0f),
                                    random_array<float, pow2_scale>(rng, sk, 1.0f)};
        const auto in_place = [](const auto& p) { return reduce_sum(attention(p[0], p[1], p[2], true) * 3.0); };
        const auto composed = [](const auto& p) {
            std::vector<std::size_t> perm(p[1].dimension());
            for (std::size_t d = 0; d < perm.size(); ++d) perm[d] = d;
            std::swap(perm[perm.size() - 2], perm[perm.size() - 1]);
            const double scale = 1.0 / std::sqrt(double(p[0].shape()[p[0].dimension() - 1]));
            return reduce_sum(matmul(softmax(causal_mask(matmul(p[0], transpose(p[1], perm)) * scale), p[0].dimension() - 1), p[2]) * 3.0);
        };
        const auto [value, grads] = ad::value_and_grad<unit_scaling>(in_place, params);
        const auto [want, want_grads] = ad::value_and_grad<unit_scaling>(composed, params);
        CHECK(value.value()() == want.value()());
        for (std::size_t which = 0; which < 3; ++which) {
            INFO(shape_string(sq) << " x " << shape_string(sk) << ", input " << which);
            const auto g = grads[which].as<float>(), h = want_grads[which].as<float>();
            CHECK(g.scale() == h.scale());
            CHECK((g.data() == h.data()));
        }
    }
}
