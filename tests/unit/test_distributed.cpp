// Data-parallel reductions (docs/distributed.md) with ranks as threads (dist::thread_group): the
// collectives, all_reduce_gradients against sums in double and bit for bit across ranks, every
// scale decision agreeing across ranks, the loss scaler skipping on every rank, and R ranks
// training bit for bit as one process that sums its R shards' gradients in rank order.
#include <scalify/dist/all_reduce.hpp>
#include <scalify/dist/thread_group.hpp>
#include <scalify/scalify.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

using namespace scalify;

namespace distributed_test {

using grads_t = std::vector<ad::gradient<pow2_scale>>;

/// Rank r's data: a (rows, cols) array of N(0, 1) x 2^exponent, reproducible from (seed, r).
xt::xarray<float> rank_data(unsigned seed, int rank, std::size_t rows, std::size_t cols, int exponent)
{
    std::mt19937 rng(seed * 131 + static_cast<unsigned>(rank));
    std::normal_distribution<float> normal;
    xt::xarray<float> x = xt::xarray<float>::from_shape({rows, cols});
    for (auto& v : x) v = std::ldexp(normal(rng), exponent);
    return x;
}

/// The bits of every element of every gradient's value, for comparisons across ranks.
std::vector<std::uint32_t> value_bits(const grads_t& grads)
{
    std::vector<std::uint32_t> bits;
    for (const auto& g : grads) {
        for (const float v : g.value()) bits.push_back(std::bit_cast<std::uint32_t>(v));
    }
    return bits;
}

/// A small MLP's parameters as one tree, identical on every rank (seeded).
std::vector<ScaledArray<float, pow2_scale>> mlp_parameters()
{
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
    const std::size_t shapes[][2] = {{8, 16}, {1, 16}, {16, 4}};
    std::vector<ScaledArray<float, pow2_scale>> params;
    for (const auto& s : shapes) {
        xt::xarray<float> w = xt::xarray<float>::from_shape({s[0], s[1]});
        for (auto& v : w) v = uniform(rng);
        if (s[0] == 1) w.reshape({s[1]});
        params.push_back(as_scaled_array<pow2_scale>(std::move(w)));
    }
    return params;
}

struct shard {
    ScaledArray<float, pow2_scale> x;
    std::vector<std::uint8_t> labels;
};

/// Step `step`'s global batch of `rows`, split into `ranks` equal shards; shard `rank` of it.
shard batch_shard(int step, int rank, int ranks, std::size_t rows)
{
    const std::size_t local = rows / static_cast<std::size_t>(ranks);
    const xt::xarray<float> all = rank_data(100 + static_cast<unsigned>(step), 0, rows, 8, 0);
    xt::xarray<float> x = xt::view(all, xt::range(static_cast<std::size_t>(rank) * local, (static_cast<std::size_t>(rank) + 1) * local), xt::all());
    std::vector<std::uint8_t> labels(local);
    for (std::size_t i = 0; i < local; ++i) labels[i] = static_cast<std::uint8_t>((static_cast<std::size_t>(rank) * local + i + static_cast<std::size_t>(step)) % 4);
    return {as_scaled_array<pow2_scale>(std::move(x)), std::move(labels)};
}

template <class Params>
grads_t shard_gradients(const Params& params, const shard& s)
{
    auto [loss, grads] = ad::value_and_grad<unit_scaling>(
        [&](const auto& p) {
            const auto h = relu(matmul(s.x, p[0]) + p[1]);
            return softmax_cross_entropy(dynamic_rescale_l2_grad(matmul(h, p[2])), s.labels);
        },
        params);
    return grads;
}

}  // namespace distributed_test

using namespace distributed_test;

TEST_CASE("one process: every reduction is the identity and nothing is counted", "[distributed]")
{
    dist::reducer& world = dist::current_reducer();
    CHECK(&world == &dist::single_process_reducer());
    CHECK(world.rank() == 0);
    CHECK(world.size() == 1);
    std::vector<double> v{1.0, -2.0, std::numeric_limits<double>::quiet_NaN()};
    world.max(v);
    world.sum(v);
    CHECK(v[0] == 1.0);
    CHECK(v[1] == -2.0);
    CHECK(std::isnan(v[2]));
    CHECK(world.any(true));
    CHECK_FALSE(world.any(false));
    grads_t grads{ad::gradient<pow2_scale>(as_scaled_array<pow2_scale>(rank_data(1, 0, 3, 5, 2)))};
    const xt::xarray<float> before = grads[0].value();
    const auto report = dist::all_reduce_gradients(grads);
    CHECK(report.payload_bytes == 0);
    CHECK(world.traffic().collectives == 0);
    CHECK((grads[0].value() == before));
}

TEST_CASE("thread_group collectives fold in rank order on every rank", "[distributed]")
{
    for (const int ranks : {2, 3, 4}) {
        dist::thread_group group(ranks);
        std::vector<std::vector<double>> maxima(static_cast<std::size_t>(ranks)), sums(maxima);
        std::vector<std::vector<std::byte>> gathered(maxima.size());
        std::vector<int> any_set(maxima.size()), any_clear(maxima.size()), current_ok(maxima.size());
        std::vector<std::size_t> collectives(maxima.size());  // Catch2's assertions are for the main thread
        group.run([&](dist::reducer& world) {
            const int r = world.rank();
            const auto i = static_cast<std::size_t>(r);
            current_ok[i] = &dist::current_reducer() == &world && world.size() == ranks;
            std::vector<double> m{double(r), -double(r), r == 1 ? std::numeric_limits<double>::quiet_NaN() : 0.0};
            world.max(m);
            maxima[i] = m;
            std::vector<double> s{0.1 * (r + 1), r == 0 ? 1e16 : 1.0};
            world.sum(s);
            sums[i] = s;
            const std::byte mine[2] = {std::byte(r), std::byte(10 + r)};
            gathered[i].resize(2 * static_cast<std::size_t>(ranks));
            world.all_gather(mine, gathered[i]);
            any_set[i] = world.any(r == ranks - 1);
            any_clear[i] = world.any(false);
            collectives[i] = world.traffic().collectives;
        });
        for (int r = 0; r < ranks; ++r) {
            const auto i = static_cast<std::size_t>(r);
            CHECK(maxima[i][0] == ranks - 1);
            CHECK(maxima[i][1] == 0.0);
            CHECK(std::isnan(maxima[i][2]));
            // Rank order: ((0.1 + 0.2) + 0.3) + ..., and 1e16 + 1.0 + ... as a left fold.
            double expected0 = 0.0, expected1 = 0.0;
            for (int k = 0; k < ranks; ++k) expected0 = k == 0 ? 0.1 : expected0 + 0.1 * (k + 1);
            for (int k = 0; k < ranks; ++k) expected1 = k == 0 ? 1e16 : expected1 + 1.0;
            CHECK(std::bit_cast<std::uint64_t>(sums[i][0]) == std::bit_cast<std::uint64_t>(expected0));
            CHECK(sums[i][1] == expected1);
            for (int k = 0; k < ranks; ++k) {
                CHECK(gathered[i][2 * static_cast<std::size_t>(k)] == std::byte(k));
                CHECK(gathered[i][2 * static_cast<std::size_t>(k) + 1] == std::byte(10 + k));
            }
            CHECK(current_ok[i] == 1);
            CHECK(collectives[i] == 5);
            CHECK(any_set[i] == 1);
            CHECK(any_clear[i] == 0);
        }
    }
}

TEST_CASE("thread_group: misuse is a typed error, and a failed rank does not hang the others", "[distributed]")
{
    CHECK_THROWS_AS(dist::thread_group(0), config_error);
    dist::thread_group group(2);
    CHECK_THROWS_AS(group.member_at(2), config_error);
    // Blocks of different sizes: every rank throws.
    CHECK_THROWS_AS(group.run([](dist::reducer& world) {
        std::vector<std::byte> mine(static_cast<std::size_t>(world.rank()) + 1), all(2 * mine.size());
        world.all_gather(mine, all);
    }),
                    distributed_error);
    dist::thread_group second(2);
    CHECK_THROWS_AS(second.run([](dist::reducer& world) {
        if (world.rank() == 1) throw shape_error("rank 1 fails before the collective");
        (void)world.sum(1.0);  // rank 0 waits for rank 1: it must be released
    }),
                    shape_error);
    dist::thread_group third(2);
    CHECK_THROWS_AS(third.run([](dist::reducer& world) {
        std::vector<std::byte> mine(4), all(4);  // needs 8
        world.all_gather(mine, all);
    }),
                    shape_error);
}

TEST_CASE("all_reduce_gradients: the mean in double to within one rounding, the same bits on every rank", "[distributed]")
{
    for (const int ranks : {2, 3}) {
        for (const bool fp8_wire : {false, true}) {
            dist::thread_group group(ranks);
            std::vector<grads_t> results(static_cast<std::size_t>(ranks));
            std::vector<dist::all_reduce_report> reports(results.size());
            group.run([&](dist::reducer& world) {
                const int r = world.rank();
                // Tensors of several types, scales and magnitudes per rank: float32, E5M2 and
                // bfloat16 data, the second tensor's magnitudes 2^12 apart between ranks.
                grads_t grads;
                grads.emplace_back(as_scaled_array<pow2_scale>(rank_data(5, r, 4, 6, 0)));
                grads.emplace_back(ScaledArray<float, pow2_scale>(rank_data(6, r, 3, 3, 0), std::ldexp(1.0f, 12 * r - 8)));
                grads.emplace_back(cast<float8_e5m2>(ScaledArray<float, pow2_scale>(rank_data(7, r, 2, 5, 3), 0.25f)));
                grads.emplace_back(cast<Eigen::bfloat16>(ScaledArray<float, pow2_scale>(rank_data(8, r, 5, 1, -3), 4.0f)));
                dist::all_reduce_options options;
                if (fp8_wire) options.wire = dtype::float8_e5m2;
                reports[static_cast<std::size_t>(r)] = dist::all_reduce_gradients(grads, options);
                results[static_cast<std::size_t>(r)] = std::move(grads);
            });
            // The expected mean, in double, from every rank's original values.
            std::vector<xt::xarray<double>> expected;
            for (int r = 0; r < ranks; ++r) {
                const std::vector<xt::xarray<double>> values{
                    xt::xarray<double>(rank_data(5, r, 4, 6, 0)),
                    xt::xarray<double>(rank_data(6, r, 3, 3, 0) * std::ldexp(1.0, 12 * r - 8)),
                    xt::xarray<double>(cast<float8_e5m2>(ScaledArray<float, pow2_scale>(rank_data(7, r, 2, 5, 3), 0.25f)).value()),
                    xt::xarray<double>(cast<Eigen::bfloat16>(ScaledArray<float, pow2_scale>(rank_data(8, r, 5, 1, -3), 4.0f)).value())};
                for (std::size_t t = 0; t < values.size(); ++t) {
                    if (r == 0) expected.push_back(values[t] / ranks);
                    else expected[t] += values[t] / ranks;
                }
            }
            INFO("ranks " << ranks << (fp8_wire ? ", E5M2 on the wire" : ", storage types on the wire"));
            for (std::size_t t = 0; t < expected.size(); ++t) {
                const ad::gradient<pow2_scale>& g = results[0][t];
                CHECK(g.holds<float>());
                const xt::xarray<float> got = g.value();
                const double amax = xt::amax(xt::abs(expected[t]))();
                // Storage types: exact wire, float32 sum (one rounding per addition). E5M2: 2
                // mantissa bits, relative to the common scale (the global amax).
                const double tolerance = fp8_wire ? 0.13 * amax : 4e-7 * amax;
                for (std::size_t i = 0; i < got.size(); ++i) {
                    INFO("tensor " << t << " element " << i);
                    CHECK(std::abs(double(got.data()[i]) - expected[t].data()[i]) <= tolerance);
                }
            }
            for (int r = 1; r < ranks; ++r) CHECK(value_bits(results[static_cast<std::size_t>(r)]) == value_bits(results[0]));
            for (int r = 0; r < ranks; ++r) {
                const auto& report = reports[static_cast<std::size_t>(r)];
                CHECK(report.tensors == 4);
                CHECK(report.elements == 24 + 9 + 10 + 5);
                CHECK(report.storage_bytes == 4 * (24 + 9) + 10 + 2 * 5);
                CHECK(report.wire_bytes == (fp8_wire ? 24 + 16 + 16 + 8 : 96 + 40 + 16 + 16));
                CHECK(report.payload_bytes == report.wire_bytes + 4 * 6 * 8);
                CHECK_FALSE(report.found_non_finite);
            }
        }
    }
}

TEST_CASE("all_reduce_gradients' wire encoding: each value rounded once, across its chunks' edges", "[distributed]")
{
    // encode_block reads the gradient through its type's widening function in chunks of 512:
    // every value, on either side of a chunk's edge, is the one rounding of value / s to W.
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    const auto check = [&]<class W, class T>(std::size_t n, float scale, double s) {
        xt::xarray<float> data = xt::xarray<float>::from_shape({n});
        for (auto& x : data) x = normal(rng) * 8.0f;
        if (n > 3) data(n - 2) = std::numeric_limits<float>::quiet_NaN();
        if (n > 700) data(600) = std::numeric_limits<float>::infinity();
        const ScaledArray<T, pow2_scale> array(xt::xarray<T>(xt::cast<T>(data)), scale);
        std::vector<std::byte> wire(n * sizeof(W));
        dist::detail::encode_block<W>(ad::detail::erase(array), s, wire.data());
        for (std::size_t i = 0; i < n; ++i) {
            W got;
            std::memcpy(&got, wire.data() + i * sizeof(W), sizeof(W));
            const double v = static_cast<double>(detail::load(array.data()(i)));
            const double k = static_cast<double>(scale) / s;
            const bool in_float = !std::same_as<W, double> && std::bit_cast<std::uint32_t>(static_cast<float>(k)) % (1u << 23) == 0;
            // The reference: zero for a zero scale; NaN for a non-finite value; else one rounding.
            W want = W{};
            if (scale != 0.0f) {
                const double x = in_float ? static_cast<double>(static_cast<float>(v) * static_cast<float>(k)) : v * k;
                want = std::isfinite(v) ? dist::detail::to_wire<W>(in_float ? static_cast<float>(x) : x)
                                        : std::numeric_limits<W>::quiet_NaN();
            }
            INFO("n " << n << " i " << i << " scale " << scale << " s " << s);
            CHECK(std::memcmp(&got, &want, sizeof(W)) == 0);
        }
    };
    for (const std::size_t n : {0, 1, 511, 512, 513, 1500}) {
        check.operator()<float8_e5m2, float>(n, 0.5f, 2.0);           // k a power of two: in float
        check.operator()<float8_e5m2, Eigen::bfloat16>(n, 1.0f, 3.0);  // k = 1/3: in double
        check.operator()<Eigen::half, double>(n, 1.0f, 0.25);
        check.operator()<float, float8_e4m3fn>(n, 2.0f, 1.0);
        check.operator()<double, float>(n, 0.25f, 3.0);
        check.operator()<float8_e5m2, float>(n, 0.0f, 1.0);  // a zero-scale array is zeros
    }
}

TEST_CASE("all_reduce_gradients: non-finite values and disagreeing trees", "[distributed]")
{
    dist::thread_group group(2);
    std::vector<grads_t> results(2);
    std::array<bool, 2> found{};  // one object per rank: std::vector<bool>'s packed bits race between the threads
    group.run([&](dist::reducer& world) {
        xt::xarray<float> x = rank_data(9, world.rank(), 2, 3, 0);
        if (world.rank() == 1) x(1, 2) = std::numeric_limits<float>::infinity();
        grads_t grads{ad::gradient<pow2_scale>(as_scaled_array<pow2_scale>(std::move(x))),
                      ad::gradient<pow2_scale>(ScaledArray<float, pow2_scale>(rank_data(10, world.rank(), 2, 2, 0), 0.0f))};
        found[static_cast<std::size_t>(world.rank())] = dist::all_reduce_gradients(grads).found_non_finite;
        results[static_cast<std::size_t>(world.rank())] = std::move(grads);
    });
    CHECK(found[0]);
    CHECK(found[1]);
    for (const auto& grads : results) {
        const xt::xarray<float> v = grads[0].value();
        CHECK(std::isnan(v(1, 2)));  // inf crosses as NaN
        CHECK(std::isfinite(v(0, 0)));
        CHECK((grads[1].value() == xt::zeros<float>({2, 2})));  // zero scale: zeros, whatever the data
    }

    dist::thread_group shapes(2);
    CHECK_THROWS_AS(shapes.run([](dist::reducer& world) {
        grads_t grads{ad::gradient<pow2_scale>(as_scaled_array<pow2_scale>(rank_data(11, 0, 2, 2 + std::size_t(world.rank()), 0)))};
        (void)dist::all_reduce_gradients(grads);
    }),
                    distributed_error);
    dist::thread_group types(2);
    CHECK_THROWS_WITH(types.run([](dist::reducer& world) {
        const auto x = as_scaled_array<pow2_scale>(rank_data(12, 0, 2, 2, 0));
        grads_t grads{world.rank() == 0 ? ad::gradient<pow2_scale>(x) : ad::gradient<pow2_scale>(cast<Eigen::half>(x))};
        (void)dist::all_reduce_gradients(grads);
    }),
                      Catch::Contains("gradient 0 differs between ranks (types float32 .. float16"));
}

namespace distributed_test {

/// scalify's own rescalings of a, which stay local (the design document: "every rescaling is
/// purely local, no need anymore for global reduce of statistics").
std::vector<float> local_rescalings(const ScaledArray<float, pow2_scale>& a)
{
    return {dynamic_rescale_l2(a).scale(), dynamic_rescale_max(a).scale(), dynamic_rescale_l1(a).scale(),
            mul<dynamic_abs<float8_e4m3fn>>(a, a).scale()};
}

}  // namespace distributed_test

TEST_CASE("recipe and AutoScale scales are the same on every rank; scalify's rescalings stay local", "[distributed]")
{
    dist::thread_group group(2);
    std::vector<std::vector<float>> scales(2), local(2);
    std::mutex guard;
    group.run([&](dist::reducer& world) {
        const int r = world.rank();
        // Rank 1's data are 2^10 larger: each reduced decision must follow the larger one on both ranks.
        const xt::xarray<float> x = rank_data(13, r, 8, 8, 10 * r);
        const auto a = as_scaled_array<pow2_scale>(x);
        std::vector<float> s;
        s.push_back(1.0f / current_scaling<float8_e4m3fn>{}.quantize<pow2_scale>(x).scale());
        delayed_scaling<float8_e4m3fn> delayed;
        (void)delayed.quantize(x);
        s.push_back(delayed.multiplier());
        s.push_back(ad::detail::rescale_for_cast<float8_e5m2>(a, ad::cast_scaling::current).scale());
        autoscale::scaling_context<pow2_scale> context({.analysis_iters = 2}, autoscale::conservative{});
        for (int use = 0; use < 3; ++use) (void)context.scale("x", a, dtype::float8_e4m3fn);
        s.push_back(context.prop_scale("x"));
        auto l = local_rescalings(a);
        const std::lock_guard lock(guard);
        scales[static_cast<std::size_t>(r)] = s;
        local[static_cast<std::size_t>(r)] = std::move(l);
    });
    CHECK(scales[0] == scales[1]);
    // And they are the decisions one process takes on the two ranks' data together.
    const xt::xarray<float> both = xt::concatenate(xt::xtuple(rank_data(13, 0, 8, 8, 0), rank_data(13, 1, 8, 8, 10)));
    CHECK(scales[0][0] == 1.0f / current_scaling<float8_e4m3fn>{}.quantize<pow2_scale>(both).scale());
    // Each rank's own rescalings are what one process decides on that rank's data alone.
    for (int r = 0; r < 2; ++r) {
        CHECK(local[static_cast<std::size_t>(r)] == local_rescalings(as_scaled_array<pow2_scale>(rank_data(13, r, 8, 8, 10 * r))));
    }
    CHECK(local[0] != local[1]);
}

TEST_CASE("the loss scaler skips the step on every rank when one rank sees inf", "[distributed]")
{
    dist::thread_group group(2);
    std::vector<loss_scaler_state> states(2);
    std::vector<int> skipped(2);
    group.run([&](dist::reducer& world) {
        loss_scaler scaler;
        for (int step = 0; step < 3; ++step) {
            std::vector<ScaledArray<float, pow2_scale>> grads{as_scaled_array<pow2_scale>(rank_data(14, world.rank(), 2, 2, 0))};
            if (step == 1 && world.rank() == 1) {  // one rank, one step: an injected NaN
                xt::xarray<float> d = grads[0].data();
                d(0, 1) = std::numeric_limits<float>::quiet_NaN();
                grads[0] = as_scaled_array<pow2_scale>(std::move(d));
            }
            if (scaler.unscale(grads)) ++skipped[static_cast<std::size_t>(world.rank())];
            scaler.update();
        }
        states[static_cast<std::size_t>(world.rank())] = scaler.state();
    });
    CHECK(skipped[0] == 1);
    CHECK(skipped[1] == 1);
    CHECK(states[0] == states[1]);
    CHECK(states[0].scale == 32768.0f);
}

TEST_CASE("R ranks train bit for bit as one process summing R shards' gradients in rank order", "[distributed]")
{
    constexpr int steps = 4;
    constexpr std::size_t rows = 12;
    const ad::sgd optimizer(0.5);
    for (const int ranks : {2, 3}) {
        for (const dtype precision : {dtype::float32, dtype::float8_e4m3fn}) {
            // R ranks as threads.
            dist::thread_group group(ranks);
            std::vector<std::vector<ScaledArray<float, pow2_scale>>> replicas(static_cast<std::size_t>(ranks));
            group.run([&](dist::reducer& world) {
                const ad::matmul_precision_scope recipe(precision, precision == dtype::float32 ? dtype::float32 : dtype::float8_e5m2);
                auto params = mlp_parameters();
                for (int step = 0; step < steps; ++step) {
                    grads_t grads = shard_gradients(params, batch_shard(step, world.rank(), ranks, rows));
                    (void)dist::all_reduce_gradients(grads);
                    optimizer.step(params, grads);
                }
                replicas[static_cast<std::size_t>(world.rank())] = params;
            });
            // One process: the shards one after the other, their gradients summed in rank order
            // (the all-reduce's arithmetic: v0 + v1 + ..., then / R). Each shard's scale
            // decisions (the logits cotangent's dynamic rescale) are its own, as on the ranks.
            // fp8 casts round under the matmul recipe's propagated scales, identical here too,
            // but the reference below sums float32 values: it is written for the fp32 case; for
            // fp8 the ranks are compared with each other.
            if (precision != dtype::float32) {
                for (int r = 1; r < ranks; ++r) {
                    for (std::size_t p = 0; p < replicas[0].size(); ++p) {
                        CHECK((replicas[static_cast<std::size_t>(r)][p].value() == replicas[0][p].value()));
                        CHECK(replicas[static_cast<std::size_t>(r)][p].scale() == replicas[0][p].scale());
                    }
                }
                continue;
            }
            auto params = mlp_parameters();
            for (int step = 0; step < steps; ++step) {
                std::vector<xt::xarray<float>> sum;
                for (int r = 0; r < ranks; ++r) {
                    const grads_t g = shard_gradients(params, batch_shard(step, r, ranks, rows));
                    for (std::size_t p = 0; p < g.size(); ++p) {
                        if (r == 0) sum.push_back(g[p].value());
                        else sum[p] = sum[p] + g[p].value();
                    }
                }
                grads_t mean;
                for (auto& s : sum) {
                    if (ranks == 2) s *= 0.5f;  // a power of two: the all-reduce moves it into the scale
                    else s /= float(ranks);
                    mean.emplace_back(as_scaled_array<pow2_scale>(s));
                }
                optimizer.step(params, mean);
            }
            INFO("ranks " << ranks);
            for (int r = 0; r < ranks; ++r) {
                for (std::size_t p = 0; p < params.size(); ++p) {
                    const xt::xarray<float> replica = replicas[static_cast<std::size_t>(r)][p].value();
                    const xt::xarray<float> reference = params[p].value();
                    for (std::size_t i = 0; i < reference.size(); ++i) {
                        CHECK(std::bit_cast<std::uint32_t>(replica.data()[i]) == std::bit_cast<std::uint32_t>(reference.data()[i]));
                    }
                }
            }
        }
    }
}
