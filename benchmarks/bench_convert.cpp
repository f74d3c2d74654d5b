// Bulk conversion throughput (elements/s), scalify side by side with its peers in one run:
// memcpy of the input (the bandwidth ceiling) and, when present, cuda_fp8.hpp's host emulation.
//   build/benchmarks/bench_convert --benchmark_min_time=0.5
#include <scalify/scalify.hpp>

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#if SCALIFY_BENCH_CUDA_FP8
#include <cuda_fp8.h>
#endif

using namespace scalify;

namespace {

constexpr std::size_t n = std::size_t{1} << 16;  // 256 KiB of floats: in L2, so we measure compute

const std::vector<float>& inputs()
{
    static const std::vector<float> data = [] {
        std::mt19937 rng(1);
        std::normal_distribution<float> normal(0.0f, 64.0f);
        std::vector<float> v(n);
        for (auto& x : v) x = normal(rng);
        return v;
    }();
    return data;
}

void finish(benchmark::State& state)
{
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

void memcpy_input(benchmark::State& state)
{
    std::vector<float> out(n);
    for (auto _ : state) {
        std::memcpy(out.data(), inputs().data(), n * sizeof(float));
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    finish(state);
}
BENCHMARK(memcpy_input);

template <class T, class Rounding, class Saturation>
void encode(benchmark::State& state)
{
    std::vector<T> out(n);
    for (auto _ : state) {
        convert_n<T, Rounding, Saturation>(inputs(), out);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    finish(state);
}
BENCHMARK(encode<float8_e4m3fn, round_nearest_even, no_saturation>)->Name("scalify_encode_e4m3fn_rne");
BENCHMARK(encode<float8_e4m3fn, round_nearest_even, saturate_finite>)->Name("scalify_encode_e4m3fn_satfinite");
BENCHMARK(encode<float8_e5m2, round_nearest_even, no_saturation>)->Name("scalify_encode_e5m2_rne");
BENCHMARK(encode<float8_e4m3fn, round_toward_zero, no_saturation>)->Name("scalify_encode_e4m3fn_rtz");

void encode_stochastic(benchmark::State& state)
{
    std::vector<float8_e4m3fn> out(n);
    std::uint64_t seed = 0;
    for (auto _ : state) {
        convert_n<float8_e4m3fn, round_stochastic, saturate_finite>(inputs(), out, ++seed);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    finish(state);
}
BENCHMARK(encode_stochastic)->Name("scalify_encode_e4m3fn_stochastic");

void decode(benchmark::State& state)
{
    std::vector<float8_e4m3fn> codes(n);
    convert_n<float8_e4m3fn, round_nearest_even, saturate_finite>(inputs(), codes);
    std::vector<float> out(n);
    for (auto _ : state) {
        convert_n(codes, out);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    finish(state);
}
BENCHMARK(decode)->Name("scalify_decode_e4m3fn");

template <class T, class Saturation>
void fake_quantize(benchmark::State& state)
{
    std::vector<float> out(n);
    for (auto _ : state) {
        fake_quantize_n<T, round_nearest_even, Saturation>(inputs(), out);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    finish(state);
}
BENCHMARK(fake_quantize<float8_e4m3fn, saturate_finite>)->Name("scalify_fake_quantize_e4m3fn");
// The formats with one NaN and no negative zero, unsaturated: overflow becomes their NaN.
BENCHMARK(fake_quantize<float8_e4m3fnuz, no_saturation>)->Name("scalify_fake_quantize_e4m3fnuz_rne");
BENCHMARK(fake_quantize<float8_e5m2fnuz, no_saturation>)->Name("scalify_fake_quantize_e5m2fnuz_rne");

#if SCALIFY_BENCH_CUDA_FP8
template <__nv_saturation_t Saturation, __nv_fp8_interpretation_t Format>
void cuda_encode(benchmark::State& state)
{
    std::vector<__nv_fp8_storage_t> out(n);
    for (auto _ : state) {
        const auto& in = inputs();
        for (std::size_t i = 0; i < n; ++i) out[i] = __nv_cvt_float_to_fp8(in[i], Saturation, Format);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    finish(state);
}
BENCHMARK(cuda_encode<__NV_NOSAT, __NV_E4M3>)->Name("cuda_fp8_encode_e4m3fn_rne");
BENCHMARK(cuda_encode<__NV_SATFINITE, __NV_E4M3>)->Name("cuda_fp8_encode_e4m3fn_satfinite");
BENCHMARK(cuda_encode<__NV_NOSAT, __NV_E5M2>)->Name("cuda_fp8_encode_e5m2_rne");

void cuda_decode(benchmark::State& state)
{
    std::vector<__nv_fp8_storage_t> codes(n);
    for (std::size_t i = 0; i < n; ++i) codes[i] = __nv_cvt_float_to_fp8(inputs()[i], __NV_SATFINITE, __NV_E4M3);
    std::vector<float> out(n);
    for (auto _ : state) {
        for (std::size_t i = 0; i < n; ++i) {
            out[i] = static_cast<float>(__half(__nv_cvt_fp8_to_halfraw(codes[i], __NV_E4M3)));
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    finish(state);
}
BENCHMARK(cuda_decode)->Name("cuda_fp8_decode_e4m3fn");
#endif

}  // namespace

BENCHMARK_MAIN();
