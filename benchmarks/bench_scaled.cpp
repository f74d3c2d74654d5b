// Scaled primitives side by side with the raw computation they wrap, in one run:
//   matmul 512^3 (float x float, and e4m3fn x e4m3fn) vs Eigen sgemm on float data;
//   add / mul of 2^22 floats vs xtensor's a + b / a * b into an xarray (add also with a dynamic_abs scale).
//   a 32000-class cross-entropy and embedding gradient vs the loops a user would write.
// Ratios are reported by comparing the *_scalify and *_peer lines (docs/benchmarks.md).
//   build/benchmarks/bench_scaled --benchmark_min_time=0.5
#include <scalify/scalify.hpp>

#include <benchmark/benchmark.h>
#include <xtensor/xbuilder.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

using namespace scalify;

namespace {

constexpr std::size_t dim = 512;
constexpr std::size_t elements = std::size_t{1} << 22;

xt::xarray<float> random_floats(std::vector<std::size_t> shape, unsigned seed)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    xt::xarray<float> x = xt::xarray<float>::from_shape(shape);
    for (auto& e : x) e = normal(rng);
    return x;
}

using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Like for like, the peer returns a new matrix per call as scalify's matmul returns a new array
// (on this VM the first touch of a fresh 1 MiB result costs ~1 ms of page faults). The
// "_into_reused" variant writes into one preallocated matrix: the bare sgemm.
template <bool Reuse>
void matmul_f32_peer(benchmark::State& state)
{
    const auto a = random_floats({dim, dim}, 1), b = random_floats({dim, dim}, 2);
    const Eigen::Map<const row_major> ma(a.data(), dim, dim), mb(b.data(), dim, dim);
    row_major reused(dim, dim);
    for (auto _ : state) {
        if constexpr (Reuse) {
            reused.noalias() = ma * mb;
            benchmark::DoNotOptimize(reused.data());
        } else {
            row_major c = ma * mb;
            benchmark::DoNotOptimize(c.data());
        }
    }
    state.SetItemsProcessed(state.iterations() * 2 * dim * dim * dim);
}
BENCHMARK(matmul_f32_peer<false>)->Name("matmul_f32_512_peer_eigen_sgemm")->Unit(benchmark::kMillisecond);
BENCHMARK(matmul_f32_peer<true>)->Name("matmul_f32_512_peer_eigen_sgemm_into_reused")->Unit(benchmark::kMillisecond);

void matmul_f32_scalify(benchmark::State& state)
{
    const auto a = make_scaled_array<pow2_scale>(random_floats({dim, dim}, 1), 0.5f);
    const auto b = make_scaled_array<pow2_scale>(random_floats({dim, dim}, 2), 2.0f);
    for (auto _ : state) {
        auto c = matmul(a, b);
        benchmark::DoNotOptimize(c.data().data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * dim * dim * dim);
}
BENCHMARK(matmul_f32_scalify)->Name("matmul_f32_512_scalify")->Unit(benchmark::kMillisecond);

void matmul_f32_scalify_reused(benchmark::State& state)
{
    const auto a = make_scaled_array<pow2_scale>(random_floats({dim, dim}, 1), 0.5f);
    const auto b = make_scaled_array<pow2_scale>(random_floats({dim, dim}, 2), 2.0f);
    auto c = matmul(a, b);
    for (auto _ : state) {
        c = matmul(a, b, std::move(c).release_data());  // the previous result's memory
        benchmark::DoNotOptimize(c.data().data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * dim * dim * dim);
}
BENCHMARK(matmul_f32_scalify_reused)->Name("matmul_f32_512_scalify_into_reused")->Unit(benchmark::kMillisecond);

// A short K and a large result, as an attention's scores (K = 64, 4M outputs), scaled from the
// result's amax, beside Eigen's sgemm into a reused matrix.
constexpr std::size_t wide = 2048, short_k = 64;

void matmul_short_k_peer(benchmark::State& state)
{
    const auto a = random_floats({wide, short_k}, 1), b = random_floats({short_k, wide}, 2);
    const Eigen::Map<const row_major> ma(a.data(), wide, short_k), mb(b.data(), short_k, wide);
    row_major c(wide, wide);
    for (auto _ : state) {
        c.noalias() = ma * mb;
        benchmark::DoNotOptimize(c.data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * wide * short_k * wide);
}
BENCHMARK(matmul_short_k_peer)->Name("matmul_f32_2048x64x2048_peer_eigen_sgemm_into_reused")->Unit(benchmark::kMillisecond);

void matmul_short_k_dynamic(benchmark::State& state)
{
    const auto a = make_scaled_array<pow2_scale>(random_floats({wide, short_k}, 1), 0.5f);
    const auto b = make_scaled_array<pow2_scale>(random_floats({short_k, wide}, 2), 2.0f);
    for (auto _ : state) {
        auto c = matmul<dynamic_abs<float8_e4m3fn>>(a, b);
        benchmark::DoNotOptimize(c.data().data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * wide * short_k * wide);
}
BENCHMARK(matmul_short_k_dynamic)->Name("matmul_f32_2048x64x2048_dynamic_abs_scalify")->Unit(benchmark::kMillisecond);

void matmul_fp8_peer(benchmark::State& state)
{
    // The peer gets float copies of the fp8 data for free: only the sgemm is timed.
    const auto a = cast<float>(cast<float8_e4m3fn>(as_scaled_array(random_floats({dim, dim}, 1))));
    const auto b = cast<float>(cast<float8_e4m3fn>(as_scaled_array(random_floats({dim, dim}, 2))));
    const Eigen::Map<const row_major> ma(a.data().data(), dim, dim), mb(b.data().data(), dim, dim);
    for (auto _ : state) {
        row_major c = ma * mb;
        benchmark::DoNotOptimize(c.data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * dim * dim * dim);
}
BENCHMARK(matmul_fp8_peer)->Name("matmul_e4m3fn_512_peer_eigen_sgemm_on_float_copies")->Unit(benchmark::kMillisecond);

/// Decode panels + sgemm; Out = float keeps the float32 accumulation, Out = e4m3fn also encodes.
template <class Out>
void matmul_fp8_scalify(benchmark::State& state)
{
    const auto a = cast<float8_e4m3fn>(as_scaled_array<pow2_scale>(random_floats({dim, dim}, 1)));
    const auto b = cast<float8_e4m3fn>(as_scaled_array<pow2_scale>(random_floats({dim, dim}, 2)));
    for (auto _ : state) {
        auto c = matmul<default_scaling, Out>(a, b);
        benchmark::DoNotOptimize(c.data().data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * dim * dim * dim);
}
BENCHMARK(matmul_fp8_scalify<float>)->Name("matmul_e4m3fn_512_scalify")->Unit(benchmark::kMillisecond);
BENCHMARK(matmul_fp8_scalify<float8_e4m3fn>)->Name("matmul_e4m3fn_512_fp8_out_scalify")->Unit(benchmark::kMillisecond);

template <bool Multiply>
void elementwise_peer(benchmark::State& state)
{
    const auto a = random_floats({elements}, 3), b = random_floats({elements}, 4);
    xt::xarray<float> c;
    for (auto _ : state) {
        if constexpr (Multiply) c = a * b;
        else c = a + b;
        benchmark::DoNotOptimize(c.data());
    }
    state.SetItemsProcessed(state.iterations() * elements);
}
BENCHMARK(elementwise_peer<false>)->Name("add_f32_4M_peer_xtensor")->Unit(benchmark::kMicrosecond);
BENCHMARK(elementwise_peer<true>)->Name("mul_f32_4M_peer_xtensor")->Unit(benchmark::kMicrosecond);

template <bool Multiply>
void elementwise_scalify(benchmark::State& state)
{
    const auto a = make_scaled_array<pow2_scale>(random_floats({elements}, 3), 0.5f);
    const auto b = make_scaled_array<pow2_scale>(random_floats({elements}, 4), 4.0f);
    for (auto _ : state) {
        if constexpr (Multiply) {
            auto c = mul(a, b);
            benchmark::DoNotOptimize(c.data().data());
        } else {
            auto c = add(a, b);
            benchmark::DoNotOptimize(c.data().data());
        }
    }
    state.SetItemsProcessed(state.iterations() * elements);
}
BENCHMARK(elementwise_scalify<false>)->Name("add_f32_4M_scalify")->Unit(benchmark::kMicrosecond);
BENCHMARK(elementwise_scalify<true>)->Name("mul_f32_4M_scalify")->Unit(benchmark::kMicrosecond);

// The same add with its scale from the result's amax (the result measured as it is written).
void elementwise_dynamic_scalify(benchmark::State& state)
{
    const auto a = make_scaled_array<pow2_scale>(random_floats({elements}, 3), 0.5f);
    const auto b = make_scaled_array<pow2_scale>(random_floats({elements}, 4), 4.0f);
    for (auto _ : state) {
        auto c = add<dynamic_abs<float8_e4m3fn>>(a, b);
        benchmark::DoNotOptimize(c.data().data());
    }
    state.SetItemsProcessed(state.iterations() * elements);
}
BENCHMARK(elementwise_dynamic_scalify)->Name("add_f32_4M_dynamic_abs_scalify")->Unit(benchmark::kMicrosecond);

// softmax of 2048 x 2048 floats along the last axis and along the first (lanes 2048 floats
// apart, run side by side in blocks).
template <std::size_t Axis>
void softmax_along(benchmark::State& state)
{
    const auto x = make_scaled_array<pow2_scale>(random_floats({2048, 2048}, 6), 1.0f);
    for (auto _ : state) {
        auto y = softmax(x, Axis);
        benchmark::DoNotOptimize(y.data().data());
    }
    state.SetItemsProcessed(state.iterations() * 2048 * 2048);
}
BENCHMARK(softmax_along<1>)->Name("softmax_f32_2048x2048_last_axis_scalify")->Unit(benchmark::kMillisecond);
BENCHMARK(softmax_along<0>)->Name("softmax_f32_2048x2048_first_axis_scalify")->Unit(benchmark::kMillisecond);

// The loss and gradient of a language model's head: 512 rows of 32000-class logits (a
// LLaMA-sized vocabulary), and the gradient of its embedding table (32000 x 512) from 1024 lookups.
void cross_entropy_large_vocabulary(benchmark::State& state)
{
    constexpr std::size_t batch = 512, classes = 32000;
    const auto logits = make_scaled_array<pow2_scale>(random_floats({batch, classes}, 7), 1.0f);
    std::vector<std::int32_t> labels(batch);
    for (std::size_t b = 0; b < batch; ++b) labels[b] = static_cast<std::int32_t>((b * 7919) % classes);
    for (auto _ : state) {
        auto result = softmax_cross_entropy(logits, labels);
        benchmark::DoNotOptimize(result.grad.data().data());
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batch * classes));
}
BENCHMARK(cross_entropy_large_vocabulary)->Name("softmax_cross_entropy_f32_512x32000_scalify")->Unit(benchmark::kMillisecond);

// The peer a user would write by hand: float loops on one thread, the exps stored in the fresh
// gradient and scaled in place (scalify computes in double, on the threads).
void cross_entropy_large_vocabulary_peer(benchmark::State& state)
{
    constexpr std::size_t batch = 512, classes = 32000;
    const xt::xarray<float> logits = random_floats({batch, classes}, 7);
    for (auto _ : state) {
        xt::xarray<float> grad = xt::xarray<float>::from_shape({batch, classes});
        double loss = 0.0;
        for (std::size_t b = 0; b < batch; ++b) {
            const float* x = logits.data() + b * classes;
            float* g = grad.data() + b * classes;
            const float top = *std::max_element(x, x + classes);
            float total = 0.0f;
            for (std::size_t c = 0; c < classes; ++c) total += g[c] = std::exp(x[c] - top);
            const std::size_t label = (b * 7919) % classes;
            loss += std::log(total) + top - x[label];
            for (std::size_t c = 0; c < classes; ++c) g[c] = (g[c] / total - (c == label ? 1.0f : 0.0f)) / float(batch);
        }
        benchmark::DoNotOptimize(loss);
        benchmark::DoNotOptimize(grad.data());
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batch * classes));
}
BENCHMARK(cross_entropy_large_vocabulary_peer)->Name("softmax_cross_entropy_f32_512x32000_peer_float_loops")->Unit(benchmark::kMillisecond);

void embedding_gradient_large_vocabulary(benchmark::State& state)
{
    constexpr std::size_t lookups = 1024, rows = 32000, width = 512;
    const auto g = make_scaled_array<pow2_scale>(random_floats({lookups, width}, 8), 1.0f);
    xt::xarray<std::int32_t> ids = xt::xarray<std::int32_t>::from_shape({lookups});
    for (std::size_t i = 0; i < lookups; ++i) ids(i) = static_cast<std::int32_t>((i * 104729) % rows);
    for (auto _ : state) {
        auto grad = embedding_vjp(g, ids, rows);
        benchmark::DoNotOptimize(grad.data().data());
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(rows * width));
}
BENCHMARK(embedding_gradient_large_vocabulary)->Name("embedding_vjp_f32_32000x512_1024_lookups_scalify")->Unit(benchmark::kMillisecond);

// The peer: xtensor's zeros and the rows added at their ids.
void embedding_gradient_large_vocabulary_peer(benchmark::State& state)
{
    constexpr std::size_t lookups = 1024, rows = 32000, width = 512;
    const xt::xarray<float> g = random_floats({lookups, width}, 8);
    for (auto _ : state) {
        xt::xarray<float> grad = xt::zeros<float>({rows, width});
        for (std::size_t i = 0; i < lookups; ++i) {
            float* to = grad.data() + ((i * 104729) % rows) * width;
            const float* from = g.data() + i * width;
            for (std::size_t j = 0; j < width; ++j) to[j] += from[j];
        }
        benchmark::DoNotOptimize(grad.data());
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(rows * width));
}
BENCHMARK(embedding_gradient_large_vocabulary_peer)->Name("embedding_vjp_f32_32000x512_1024_lookups_peer_xtensor")->Unit(benchmark::kMillisecond);

// Two 2048 x 2048 float arrays joined along the first axis, the scale from the result's amax,
// against xtensor's concatenate of the same data into a fresh array.
void concatenate_dynamic(benchmark::State& state)
{
    const auto a = make_scaled_array<pow2_scale>(random_floats({2048, 2048}, 9), 0.5f);
    const auto b = make_scaled_array<pow2_scale>(random_floats({2048, 2048}, 10), 4.0f);
    for (auto _ : state) {
        auto c = concatenate<dynamic_abs<float8_e4m3fn>>({a, b}, 0);
        benchmark::DoNotOptimize(c.data().data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * 2048 * 2048);
}
BENCHMARK(concatenate_dynamic)->Name("concatenate_f32_2x2048x2048_dynamic_abs_scalify")->Unit(benchmark::kMillisecond);

void concatenate_peer(benchmark::State& state)
{
    const xt::xarray<float> a = random_floats({2048, 2048}, 9), b = random_floats({2048, 2048}, 10);
    for (auto _ : state) {
        xt::xarray<float> c = xt::concatenate(xt::xtuple(a, b), 0);
        benchmark::DoNotOptimize(c.data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * 2048 * 2048);
}
BENCHMARK(concatenate_peer)->Name("concatenate_f32_2x2048x2048_peer_xtensor")->Unit(benchmark::kMillisecond);

void mx_quantize(benchmark::State& state)
{
    const auto x = random_floats({dim, 2048}, 5);  // 1 Mi floats
    for (auto _ : state) {
        auto q = quantize_mx<float8_e4m3fn>(x, 1);
        benchmark::DoNotOptimize(q.data().data());
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(x.size()));
}
BENCHMARK(mx_quantize)->Name("mx_quantize_e4m3fn_block32_scalify")->Unit(benchmark::kMicrosecond);

void per_tensor_quantize(benchmark::State& state)
{
    const auto x = random_floats({dim, 2048}, 5);
    for (auto _ : state) {
        auto q = current_scaling<float8_e4m3fn>{}.quantize<pow2_scale>(x);
        benchmark::DoNotOptimize(q.data().data());
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(x.size()));
}
BENCHMARK(per_tensor_quantize)->Name("per_tensor_quantize_e4m3fn_scalify")->Unit(benchmark::kMicrosecond);

/// Block-scaled matmul of two operands quantised by `quantize` (true: MXFP8 with E8M0 scales;
/// false: 1x128 by 128x128 float32-scaled blocks).
template <bool Mx>
void matmul_block_scaled(benchmark::State& state)
{
    const auto x = random_floats({dim, dim}, 1), w = random_floats({dim, dim}, 2);
    const auto operands = [&] {
        if constexpr (Mx) return std::pair{quantize_mx<float8_e4m3fn>(x, 1), quantize_mx<float8_e4m3fn>(w, 0)};
        else return std::pair{quantize_blocks<float8_e4m3fn>(x, 1, 128), quantize_blocks<float8_e4m3fn>(w, 128, 128)};
    }();
    for (auto _ : state) {
        auto c = matmul(operands.first, operands.second);
        benchmark::DoNotOptimize(c.data().data());
    }
    state.SetItemsProcessed(state.iterations() * 2 * dim * dim * dim);
}
BENCHMARK(matmul_block_scaled<true>)->Name("matmul_mxfp8_512_scalify")->Unit(benchmark::kMillisecond);
BENCHMARK(matmul_block_scaled<false>)->Name("matmul_e4m3fn_1x128_128x128_float_scales_512_scalify")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
