// tensor_core_probe, device side: one warp per 16 x 8 tile, D = A.B + C through one mma.sync
// (m16n8k32 fp8, m16n8k16 f16/bf16, float32 accumulator). Fragment layouts as the PTX ISA states
// them for these shapes; the host checks them first on small integers (probe_main.cpp).
#include "probe_kernels.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

namespace {

template <int Kind>
__global__ void mma_tiles(const std::uint8_t* tiles, std::uint8_t* out, int count, std::size_t stride)
{
    const int tile = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
    const int lane = static_cast<int>(threadIdx.x % 32);
    if (tile >= count) return;
    constexpr bool fp8 = Kind <= 3;
    constexpr int K = fp8 ? 32 : 16;
    constexpr int es = fp8 ? 1 : 2;
    const std::uint8_t* t = tiles + static_cast<std::size_t>(tile) * stride;
    const std::uint8_t* A = t;
    const std::uint8_t* B = t + 16 * K * es;  // column j's K codes at B[j * K]
    const auto* C = reinterpret_cast<const std::uint32_t*>(t + 24 * K * es);
    const int g = lane >> 2, q = lane & 3;
    float c[4], d[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; ++i) c[i] = __uint_as_float(C[(g + (i >= 2 ? 8 : 0)) * 8 + q * 2 + (i & 1)]);
    std::uint32_t a[4], b[2];
    if constexpr (fp8) {
        for (int r = 0; r < 4; ++r) {  // a_i, i = 4r .. 4r+3: rows g / g+8, columns q*4 + (i & 3) (+16)
            std::uint32_t v = 0;
            for (int j = 0; j < 4; ++j) {
                const int i = 4 * r + j;
                const int row = g + ((i < 4 || (i >= 8 && i < 12)) ? 0 : 8);
                const int col = q * 4 + (i & 3) + (i >= 8 ? 16 : 0);
                v |= static_cast<std::uint32_t>(A[row * K + col]) << (8 * j);
            }
            a[r] = v;
        }
        for (int r = 0; r < 2; ++r) {
            std::uint32_t v = 0;
            for (int j = 0; j < 4; ++j) {
                const int i = 4 * r + j;
                v |= static_cast<std::uint32_t>(B[g * K + q * 4 + (i & 3) + (i >= 4 ? 16 : 0)]) << (8 * j);
            }
            b[r] = v;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define PROBE_MMA_FP8(TA, TB)                                                                                        \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." TA "." TB                                                 \
                 ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"                                  \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                                    \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), \
                   "f"(c[3]))
        if constexpr (Kind == 0) PROBE_MMA_FP8("e4m3", "e4m3");
        else if constexpr (Kind == 1) PROBE_MMA_FP8("e4m3", "e5m2");
        else if constexpr (Kind == 2) PROBE_MMA_FP8("e5m2", "e4m3");
        else PROBE_MMA_FP8("e5m2", "e5m2");
#endif
    } else {
        const auto* A16 = reinterpret_cast<const std::uint16_t*>(A);
        const auto* B16 = reinterpret_cast<const std::uint16_t*>(B);
        for (int r = 0; r < 4; ++r) {  // a_i, i = 2r, 2r+1
            std::uint32_t v = 0;
            for (int j = 0; j < 2; ++j) {
                const int i = 2 * r + j;
                const int row = g + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0);
                const int col = q * 2 + (i & 1) + (i >= 4 ? 8 : 0);
                v |= static_cast<std::uint32_t>(A16[row * K + col]) << (16 * j);
            }
            a[r] = v;
        }
        for (int r = 0; r < 2; ++r) {
            std::uint32_t v = 0;
            for (int j = 0; j < 2; ++j) {
                const int i = 2 * r + j;
                v |= static_cast<std::uint32_t>(B16[g * K + q * 2 + (i & 1) + (i >= 2 ? 8 : 0)]) << (16 * j);
            }
            b[r] = v;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        if constexpr (Kind == 4)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                         "{%10,%11,%12,%13};\n"
                         : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                           "f"(c[2]), "f"(c[3]));
        else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                         "{%10,%11,%12,%13};\n"
                         : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                           "f"(c[2]), "f"(c[3]));
#endif
    }
    auto* D = reinterpret_cast<std::uint32_t*>(out + static_cast<std::size_t>(tile) * 512);
    for (int i = 0; i < 4; ++i) D[(g + (i >= 2 ? 8 : 0)) * 8 + q * 2 + (i & 1)] = __float_as_uint(d[i]);
}

bool check(cudaError_t e, const char* what, std::string& error)
{
    if (e == cudaSuccess) return true;
    error = std::string(what) + ": " + cudaGetErrorString(e);
    return false;
}

}  // namespace

namespace probe {

bool query_device(device_info& info, std::string& error)
{
    int count = 0;
    if (!check(cudaGetDeviceCount(&count), "cudaGetDeviceCount", error)) return false;
    if (count == 0) {
        error = "no CUDA device";
        return false;
    }
    cudaDeviceProp prop{};
    if (!check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties", error)) return false;
    info.name = prop.name;
    info.major = prop.major;
    info.minor = prop.minor;
    return true;
}

bool run_tiles(kind k, std::uint8_t* tiles, std::size_t count, std::string& error)
{
    const std::size_t stride = tile_bytes(k);
    std::uint8_t *device_tiles = nullptr, *device_out = nullptr;
    bool ok = check(cudaMalloc(&device_tiles, stride * count), "cudaMalloc", error) &&
              check(cudaMalloc(&device_out, 512 * count), "cudaMalloc", error) &&
              check(cudaMemset(device_out, 0xff, 512 * count), "cudaMemset", error) &&  // NaN poison
              check(cudaMemcpy(device_tiles, tiles, stride * count, cudaMemcpyHostToDevice), "cudaMemcpy", error);
    if (ok) {
        const int threads = 128;
        const int blocks = static_cast<int>((count * 32 + threads - 1) / threads);
        const int n = static_cast<int>(count);
        switch (k) {
        case kind::e4m3_e4m3: mma_tiles<0><<<blocks, threads>>>(device_tiles, device_out, n, stride); break;
        case kind::e4m3_e5m2: mma_tiles<1><<<blocks, threads>>>(device_tiles, device_out, n, stride); break;
        case kind::e5m2_e4m3: mma_tiles<2><<<blocks, threads>>>(device_tiles, device_out, n, stride); break;
        case kind::e5m2_e5m2: mma_tiles<3><<<blocks, threads>>>(device_tiles, device_out, n, stride); break;
        case kind::f16: mma_tiles<4><<<blocks, threads>>>(device_tiles, device_out, n, stride); break;
        case kind::bf16: mma_tiles<5><<<blocks, threads>>>(device_tiles, device_out, n, stride); break;
        }
        ok = check(cudaGetLastError(), "kernel launch", error) && check(cudaDeviceSynchronize(), "kernel", error);
    }
    if (ok) {
        std::vector<std::uint8_t> d(512 * count);
        ok = check(cudaMemcpy(d.data(), device_out, d.size(), cudaMemcpyDeviceToHost), "cudaMemcpy", error);
        for (std::size_t t = 0; ok && t < count; ++t) std::memcpy(tiles + t * stride + stride - 512, d.data() + t * 512, 512);
    }
    cudaFree(device_tiles);
    cudaFree(device_out);
    return ok;
}

}  // namespace probe
