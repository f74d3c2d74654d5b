#pragma once
// The device side of tensor_core_probe, as plain C++ (probe_kernels.cu implements it with nvcc).
#include <cstddef>
#include <cstdint>
#include <string>

namespace probe {

/// The operand pairs, in the order of the capture files' kinds.
enum class kind : int { e4m3_e4m3, e4m3_e5m2, e5m2_e4m3, e5m2_e5m2, f16, bf16 };

inline const char* kind_name(kind k)
{
    constexpr const char* names[] = {"e4m3_e4m3", "e4m3_e5m2", "e5m2_e4m3", "e5m2_e5m2", "f16", "bf16"};
    return names[static_cast<int>(k)];
}
inline bool is_fp8(kind k) { return static_cast<int>(k) <= static_cast<int>(kind::e5m2_e5m2); }
inline std::size_t k_of(kind k) { return is_fp8(k) ? 32 : 16; }
inline std::size_t element_bytes(kind k) { return is_fp8(k) ? 1 : 2; }
/// A (16 x K), B (8 columns of K), C and D (16 x 8 float32).
inline std::size_t tile_bytes(kind k) { return 24 * k_of(k) * element_bytes(k) + 1024; }

struct device_info {
    std::string name;
    int major = 0, minor = 0;
};

/// GPU 0's name and compute capability; false (and why) when there is none.
bool query_device(device_info& info, std::string& error);

/// Runs `count` tile records through `mma.sync` on GPU 0 (m16n8k32 for fp8, needs sm_89;
/// m16n8k16 for f16/bf16, sm_80), writing each tile's D. false (and why) on a CUDA error.
bool run_tiles(kind k, std::uint8_t* tiles, std::size_t count, std::string& error);

}  // namespace probe
