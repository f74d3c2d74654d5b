// Arrays past the size where element-wise loops split across OpenMP threads (when the tests are
// built with OpenMP) and the layouts with fast paths (a bias row broadcast over a batch, column
// and row sums, transposed GEMM operands): every result equals an element-by-element reference
// computed here, bit for bit, on one thread and on all.
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

using namespace scalify;

namespace {

constexpr std::size_t n_rows = 384, n_cols = 320;  // 122 880 elements: more than two parallel grains

xt::xarray<float> normal_data(std::mt19937& rng, std::vector<std::size_t> shape)
{
    std::normal_distribution<float> normal(0.0f, 3.0f);
    auto out = xt::xarray<float>::from_shape(shape);
    for (auto& v : out) v = normal(rng);
    return out;
}

template <class T>
std::vector<std::uint8_t> bytes_of(const xt::xarray<T>& data)
{
    const auto* p = reinterpret_cast<const std::uint8_t*>(data.data());
    return {p, p + data.size() * sizeof(T)};
}

/// Runs f on one thread and on all; the two results must have the same bytes and scale.
template <class F>
auto on_any_thread_count(F f)
{
#if defined(_OPENMP)
    const int all = omp_get_max_threads();
    omp_set_num_threads(1);
    const auto single = f();
    omp_set_num_threads(all);
    const auto parallel = f();
    CHECK(bytes_of(single.data()) == bytes_of(parallel.data()));
    CHECK(single.scale() == parallel.scale());
    return parallel;
#else
    return f();
#endif
}

}  // namespace

TEST_CASE("large element-wise ops, casts and reductions give the same bits on any thread count", "[ops][parallel]")
{
    std::mt19937 rng(5);
    using A = ScaledArray<float, pow2_scale>;
    const A x(normal_data(rng, {n_rows, n_cols}), 0.25f);
    const A bias(normal_data(rng, {n_cols}), 2.0f);

    SECTION("a bias row broadcast over the batch")
    {
        const auto y = on_any_thread_count([&] { return add<natural_scaling>(x, bias); });
        REQUIRE(y.scale() == 2.0f);  // natural: the larger input scale
        for (std::size_t r = 0; r < n_rows; ++r)
            for (std::size_t c = 0; c < n_cols; ++c)
                REQUIRE(y.data()(r, c) == x.data()(r, c) * 0.125f + bias.data()(c));
    }
    SECTION("an amax-scaled result")
    {
        // dynamic_abs<E4M3>: the amax lands at E4M3's max, 448.
        const auto y = on_any_thread_count([&] { return relu<dynamic_abs<float8_e4m3fn>>(x); });
        float amax = 0.0f;
        for (const float v : x.data()) amax = std::max(amax, v);
        for (std::size_t i = 0; i < x.size(); ++i) {
            REQUIRE(static_cast<double>(y.data().data()[i]) * y.scale() ==
                    static_cast<double>(std::max(0.0f, x.data().data()[i])) * x.scale());
        }
        const float data_max = *std::max_element(y.data().begin(), y.data().end());
        CHECK(data_max <= 448.0f);
        CHECK(data_max > 224.0f);
        CHECK(y.scale() == x.scale() * amax / data_max);
    }
    SECTION("casts to fp8 and to half, and rebalance_scale")
    {
        const auto e4 = on_any_thread_count([&] { return cast<float8_e4m3fn, round_nearest_even, saturate_finite>(x); });
        const auto h = on_any_thread_count([&] { return cast<Eigen::half>(x); });
        const auto r = on_any_thread_count([&] { return rebalance_scale(x, 4.0); });
        for (std::size_t i = 0; i < x.size(); ++i) {
            const float v = x.data().data()[i];
            REQUIRE(std::bit_cast<std::uint8_t>(e4.data().data()[i]) ==
                    std::bit_cast<std::uint8_t>(convert<float8_e4m3fn, round_nearest_even, saturate_finite>(v)));
            REQUIRE(std::bit_cast<std::uint16_t>(h.data().data()[i]) == std::bit_cast<std::uint16_t>(Eigen::half(v)));
            REQUIRE(r.data().data()[i] == v / 4.0f);
        }
    }
    SECTION("column sums (a bias gradient) and row sums add in row-major order")
    {
        const auto columns = reduce_sum<natural_scaling>(x, {0});
        const auto row_sums = reduce_sum<natural_scaling>(x, {1});
        for (std::size_t c = 0; c < n_cols; ++c) {
            float sum = 0.0f;
            for (std::size_t r = 0; r < n_rows; ++r) sum += x.data()(r, c);
            REQUIRE(columns.data()(c) == sum);
        }
        for (std::size_t r = 0; r < n_rows; ++r) {
            float sum = 0.0f;
            for (std::size_t c = 0; c < n_cols; ++c) sum += x.data()(r, c);
            REQUIRE(row_sums.data()(r) == sum);
        }
    }
}

TEST_CASE("a large vocabulary's cross-entropy and embedding gradient give the same bits on any thread count",
          "[nn][parallel]")
{
    std::mt19937 rng(13);
    SECTION("softmax_cross_entropy: rows on the threads, their losses summed in row order")
    {
        const std::size_t batch = 48, classes = 5000;  // 240 000 logits: several parallel grains
        const ScaledArray<float, pow2_scale> logits(normal_data(rng, {batch, classes}), 0.5f);
        std::vector<std::int32_t> labels(batch);
        for (std::size_t b = 0; b < batch; ++b) labels[b] = static_cast<std::int32_t>((b * 977) % classes);
        double loss = 0.0;
        const auto grad = on_any_thread_count([&] {
            auto result = softmax_cross_entropy(logits, labels);
            loss = result.loss;
            return std::move(result.grad);
        });
        // The rule of the documentation, one row after the other, in double.
        double expected_loss = 0.0;
        for (std::size_t b = 0; b < batch; ++b) {
            const float* row = logits.data().data() + b * classes;
            double top = -std::numeric_limits<double>::infinity(), total = 0.0;
            for (std::size_t c = 0; c < classes; ++c) top = std::max(top, static_cast<double>(row[c]) * 0.5);
            std::vector<double> e(classes);
            for (std::size_t c = 0; c < classes; ++c) total += e[c] = std::exp(static_cast<double>(row[c]) * 0.5 - top);
            expected_loss += std::log(total) + top - static_cast<double>(row[labels[b]]) * 0.5;
            for (std::size_t c = 0; c < classes; ++c) {
                const double g = (e[c] / total - (static_cast<std::int32_t>(c) == labels[b] ? 1.0 : 0.0)) / static_cast<double>(batch);
                REQUIRE(grad.data()(b, c) == static_cast<float>(g));
            }
        }
        CHECK(grad.scale() == 1.0f);
        CHECK(loss == expected_loss / static_cast<double>(batch));
    }
    SECTION("embedding_vjp: only the looked-up rows summed, in id order")
    {
        const std::size_t lookups = 700, rows = 3000, width = 96;
        const ScaledArray<float, pow2_scale> g(normal_data(rng, {lookups, width}), 0.25f);
        xt::xarray<std::int64_t> ids = xt::xarray<std::int64_t>::from_shape({lookups});
        for (std::size_t i = 0; i < lookups; ++i) ids(i) = static_cast<std::int64_t>((i * i + 3 * i) % 997);  // repeats
        const auto grad = on_any_thread_count([&] { return embedding_vjp(g, ids, rows); });
        std::vector<float> expected(rows * width, 0.0f);
        for (std::size_t i = 0; i < lookups; ++i)
            for (std::size_t j = 0; j < width; ++j) expected[static_cast<std::size_t>(ids(i)) * width + j] += g.data()(i, j);
        CHECK(grad.scale() == 0.25f);
        REQUIRE(grad.size() == expected.size());
        CHECK(std::equal(expected.begin(), expected.end(), grad.data().begin()));
    }
}

TEST_CASE("float32 GEMMs give the same bits on any thread count", "[matmul][parallel]")
{
    // Eigen's parallel GEMM picks its depth blocking by thread count (sums of 512 and more
    // products rounded differently on 1 and 2 threads); scalify's slabs keep the 1-thread order.
    std::mt19937 rng(21);
    using A = ScaledArray<float, pow2_scale>;
    // N one past the threads' slab grid, with fewer rows than columns: the last slab is one
    // column wide (it ran Eigen's GEMV kernel, which sums in another order than the GEMM).
    using traits = Eigen::internal::gebp_traits<float, float>;
    const std::size_t past_grid = std::lcm(std::size_t(traits::mr), std::size_t(traits::nr)) + 1;
    const std::vector<std::vector<std::size_t>> shapes = {{128, 784, 512}, {200, 1000, 130}, {97, 640, 301}, {30, 2048, 700},
                                                          {3, 900, 400},   {40, 200, past_grid}, {2, 6000, past_grid}};
    for (const auto& s : shapes) {
        const std::size_t m = s[0], k = s[1], n = s[2];
        INFO("M, K, N = " << m << ", " << k << ", " << n);
        const A a(normal_data(rng, {m, k}), 0.5f), b(normal_data(rng, {k, n}), 2.0f), g(normal_data(rng, {m, n}), 1.0f);
        (void)on_any_thread_count([&] { return matmul<unit_scaling>(a, b); });
        (void)on_any_thread_count([&] { return matmul<natural_scaling>(a, b); });
        (void)on_any_thread_count([&] { return matmul<dynamic_abs<float8_e4m3fn>>(a, b); });
        (void)on_any_thread_count([&] { return matmul_vjp<unit_scaling>(g, a, b).first; });
        (void)on_any_thread_count([&] { return matmul_vjp<unit_scaling>(g, a, b).second; });
        const auto a8 = cast<float8_e4m3fn, round_nearest_even, saturate_finite>(a);
        const auto b8 = cast<float8_e4m3fn, round_nearest_even, saturate_finite>(b);
        (void)on_any_thread_count([&] { return matmul<unit_scaling, float>(a8, b8); });
    }
}

TEST_CASE("matmul_vjp reads its transposed operands in place and equals the products of copied transposes",
          "[matmul][parallel]")
{
    std::mt19937 rng(9);
    using A = ScaledArray<float, pow2_scale>;
    const A a(normal_data(rng, {96, 80}), 0.5f), b(normal_data(rng, {80, 72}), 4.0f), g(normal_data(rng, {96, 72}), 0.125f);
    const auto [ga, gb] = matmul_vjp<unit_scaling>(g, a, b);
    const auto ga_copied = matmul<unit_scaling>(g, transpose(b));
    const auto gb_copied = matmul<unit_scaling>(transpose(a), g);
    CHECK(bytes_of(ga.data()) == bytes_of(ga_copied.data()));
    CHECK(ga.scale() == ga_copied.scale());
    CHECK(bytes_of(gb.data()) == bytes_of(gb_copied.data()));
    CHECK(gb.scale() == gb_copied.scale());

    // fp8 operands through an H100 accumulation model: the model reads row-major operands, so
    // the transposed one is copied; the result is the same as from the copied transpose.
    const auto a8 = cast<float8_e4m3fn, round_nearest_even, saturate_finite>(a);
    const auto b8 = cast<float8_e4m3fn, round_nearest_even, saturate_finite>(b);
    const auto g8 = cast<float8_e5m2, round_nearest_even, saturate_finite>(g);
    tensor_core::accumulation_scope<> h100("h100");
    const auto [ga8, gb8] = matmul_vjp<unit_scaling, float>(g8, a8, b8);
    CHECK(bytes_of(ga8.data()) == bytes_of(matmul<unit_scaling, float>(g8, transpose(b8)).data()));
    CHECK(bytes_of(gb8.data()) == bytes_of(matmul<unit_scaling, float>(transpose(a8), g8).data()));
    CHECK_THROWS_AS(matmul_vjp(g, b, a), shape_error);
}

TEST_CASE("block-scaled GEMMs give the same bits on any thread count", "[block][parallel]")
{
    // Sums of 1024 products: Eigen's own parallel GEMM, which the block-scaled matmul ran, rounded
    // them differently on 1 and 2 threads.
    std::mt19937 rng(22);
    const auto a = quantize_mx<float8_e4m3fn>(normal_data(rng, {64, 1024}), 1);
    const auto b = quantize_mx<float8_e4m3fn>(normal_data(rng, {1024, 96}), 0);
    (void)on_any_thread_count([&] { return matmul(a, b); });
    const auto af = quantize_blocks<float8_e4m3fn>(normal_data(rng, {64, 1024}), 1, 128);
    const auto bf = quantize_blocks<float8_e4m3fn>(normal_data(rng, {1024, 96}), 128, 96);
    (void)on_any_thread_count([&] { return matmul(af, bf); });
}
