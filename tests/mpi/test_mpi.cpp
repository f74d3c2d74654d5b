// dist::mpi_reducer on the ranks of mpirun (ctest: 2): the collectives, all_reduce_gradients the
// same bits on every rank and equal to the sum each rank recomputes from every rank's inputs,
// current scaling's amax agreed, and a NaN injected on one rank making every rank's loss scaler
// skip the step. The logic itself is covered under the sanitizers by unit/test_distributed.cpp
// (ranks as threads); this checks the MPI transport. Exit 0 when every check passed on every rank.
#include <scalify/dist/all_reduce.hpp>
#include <scalify/dist/mpi.hpp>
#include <scalify/strategy/amax_scaling.hpp>
#include <scalify/train/loss_scaler.hpp>

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace scalify;

namespace {

int failures = 0;

void check(bool ok, int rank, const std::string& what)
{
    if (!ok) {
        ++failures;
        fmt::print(stderr, "rank {}: FAILED {}\n", rank, what);
    }
}

xt::xarray<float> rank_data(unsigned seed, int rank, std::size_t n, int exponent)
{
    std::mt19937 rng(seed * 131 + static_cast<unsigned>(rank));
    std::normal_distribution<float> normal;
    xt::xarray<float> x = xt::xarray<float>::from_shape({n});
    for (auto& v : x) v = std::ldexp(normal(rng), exponent);
    return x;
}

/// Whether every rank holds the same bits.
bool same_on_every_rank(dist::reducer& world, const xt::xarray<float>& x)
{
    std::vector<double> bits(x.size()), negated(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        bits[i] = static_cast<double>(std::bit_cast<std::uint32_t>(x.data()[i]));
        negated[i] = -bits[i];
    }
    world.max(bits);
    world.max(negated);
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (bits[i] != -negated[i]) return false;
    }
    return true;
}

}  // namespace

int main(int argc, char** argv)
{
    try {
        dist::mpi_session session(argc, argv);
        dist::mpi_reducer world;
        const dist::reduction_scope scope(world);
        const int rank = world.rank();
        const int ranks = world.size();
        check(ranks >= 2, rank, fmt::format("at least 2 ranks (got {})", ranks));

        // Collectives.
        check(world.sum(static_cast<double>(rank + 1)) == ranks * (ranks + 1) / 2.0, rank, "sum");
        check(world.max(static_cast<double>(rank)) == ranks - 1, rank, "max");
        check(std::isnan(world.max(rank == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0)), rank, "max with NaN");
        check(world.any(rank == ranks - 1) && !world.any(false), rank, "any");
        std::vector<std::byte> all(3 * static_cast<std::size_t>(ranks));
        const std::byte mine[3] = {std::byte(rank), std::byte(rank + 1), std::byte(rank + 2)};
        world.all_gather(mine, all);
        for (int r = 0; r < ranks; ++r) check(all[3 * static_cast<std::size_t>(r) + 2] == std::byte(r + 2), rank, "all_gather order");

        // all_reduce_gradients: float32 and E5M2 tensors, scales 2^10 apart between ranks.
        for (const bool fp8_wire : {false, true}) {
            std::vector<ad::gradient<pow2_scale>> grads{
                ad::gradient<pow2_scale>(ScaledArray<float, pow2_scale>(rank_data(1, rank, 1000, 0), std::ldexp(1.0f, 10 * rank))),
                ad::gradient<pow2_scale>(cast<float8_e5m2>(ScaledArray<float, pow2_scale>(rank_data(2, rank, 37, 2), 0.5f)))};
            dist::all_reduce_options options;
            if (fp8_wire) options.wire = dtype::float8_e5m2;
            world.reset_traffic();
            const auto report = dist::all_reduce_gradients(grads, options);
            check(world.traffic().payload_bytes == report.payload_bytes, rank, "payload counted");
            check(report.wire_bytes == (fp8_wire ? 1000 + 40 : 4000 + 40), rank, fmt::format("wire bytes {}", report.wire_bytes));
            check(report.payload_bytes <= report.wire_bytes + 2 * 6 * 8, rank, "payload = data + agreement");
            for (std::size_t t = 0; t < grads.size(); ++t) {
                const xt::xarray<float> got = grads[t].value();
                check(same_on_every_rank(world, got), rank, fmt::format("tensor {} the same bits on every rank", t));
                double amax = 0.0;
                std::vector<double> expected(got.size(), 0.0);
                for (int r = 0; r < ranks; ++r) {
                    const xt::xarray<float> v =
                        t == 0 ? xt::xarray<float>(rank_data(1, r, 1000, 0) * std::ldexp(1.0f, 10 * r))
                               : xt::xarray<float>(cast<float8_e5m2>(ScaledArray<float, pow2_scale>(rank_data(2, r, 37, 2), 0.5f)).value());
                    for (std::size_t i = 0; i < v.size(); ++i) expected[i] += double(v.data()[i]) / ranks;
                }
                for (const double e : expected) amax = std::max(amax, std::abs(e));
                const double tolerance = (fp8_wire ? 0.13 : 4e-7) * amax * ranks;
                for (std::size_t i = 0; i < got.size(); ++i) {
                    check(std::abs(double(got.data()[i]) - expected[i]) <= tolerance, rank,
                          fmt::format("tensor {} element {}: {} against {}", t, i, got.data()[i], expected[i]));
                }
            }
        }

        // Current scaling: the same scale on every rank, from the largest amax.
        const auto q = current_scaling<float8_e4m3fn>{}.quantize<pow2_scale>(rank_data(3, rank, 64, 4 * rank));
        check(same_on_every_rank(world, xt::xarray<float>{q.scale()}), rank, "current scaling's scale");

        // A NaN on the last rank, at step 1: every rank skips that step and backs off alike.
        loss_scaler scaler;
        int skipped = 0;
        for (int step = 0; step < 3; ++step) {
            xt::xarray<float> g = rank_data(4, rank, 8, 0);
            if (step == 1 && rank == ranks - 1) g(3) = std::numeric_limits<float>::quiet_NaN();
            std::vector<ScaledArray<float, pow2_scale>> grads{as_scaled_array<pow2_scale>(std::move(g))};
            skipped += scaler.unscale(grads) ? 1 : 0;
            scaler.update();
        }
        check(skipped == 1, rank, fmt::format("skipped {} steps, expected 1", skipped));
        check(same_on_every_rank(world, xt::xarray<float>{scaler.scale()}), rank, "loss scale");

        const bool all_passed = !world.any(failures != 0);
        if (rank == 0) fmt::print("mpi: {} ranks, {}\n", ranks, all_passed ? "all checks passed" : "some checks FAILED");
        return all_passed ? 0 : 1;
    } catch (const std::exception& e) {
        fmt::print(stderr, "test_mpi: {}\n", e.what());
        return 2;
    }
}
