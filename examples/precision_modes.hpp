// The precision modes the training examples share (fashion_mnist, char_lm): what a mode casts
// each matmul's operands and cotangents to, how those casts are scaled, and which scale rules the
// model runs under. A mode is applied around the model (ad::matmul_precision_scope), never in it.
#pragma once

#include <scalify/scalify.hpp>

#include <fmt/format.h>

#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace examples {

struct precision_mode {
    std::string_view name;
    scalify::dtype forward;   ///< matmul operands
    scalify::dtype gradient;  ///< cotangents reaching a matmul
    scalify::ad::cast_scaling scaling;
    bool unit_scaled;  ///< unit_scaling rules and unit-data parameters (else natural scales, scale-1 parameters)
    std::string_view about;
};

using scalify::dtype;
using scalify::ad::cast_scaling;

/// fp32, scalify's propagated fp16 / bf16 / fp8, per-tensor current-scaled fp8, plain fp8.
inline constexpr precision_mode precision_modes[] = {
    {"fp32", dtype::float32, dtype::float32, cast_scaling::propagated, false, "float32 reference"},
    {"fp16", dtype::float16, dtype::float16, cast_scaling::propagated, true, "scalify: fp16 matmuls, scales propagated"},
    {"bf16", dtype::bfloat16, dtype::bfloat16, cast_scaling::propagated, true, "scalify: bf16 matmuls, scales propagated"},
    {"fp8", dtype::float8_e4m3fn, dtype::float8_e5m2, cast_scaling::propagated, true,
     "scalify: E4M3 forward / E5M2 gradients, scales propagated"},
    {"fp8-current", dtype::float8_e4m3fn, dtype::float8_e5m2, cast_scaling::current, false,
     "per-tensor current scaling at every cast"},
    {"fp8-unscaled", dtype::float8_e4m3fn, dtype::float8_e5m2, cast_scaling::unscaled, false, "plain fp8, scale 1"},
};

/// The modes' scale rules, chosen when the program runs: the model compiles once for all modes
/// rather than once per strategy.
using mode_scaling = scalify::runtime_scaling<scalify::unit_scaling, scalify::natural_scaling>;

/// Runs mode m's rules (unit_scaling or natural_scaling) on this thread while the result lives.
[[nodiscard]] inline mode_scaling::scope scaling_of(const precision_mode& m)
{
    return mode_scaling::scope(m.unit_scaled ? mode_scaling::index_of<scalify::unit_scaling>
                                             : mode_scaling::index_of<scalify::natural_scaling>);
}

/// The mode called `name` among precision_modes and an example's own `extra` modes;
/// std::runtime_error listing every name otherwise.
inline const precision_mode& find_mode(std::string_view name, std::span<const precision_mode> extra = {})
{
    std::string names;
    for (const auto table : {std::span<const precision_mode>(precision_modes), extra}) {
        for (const auto& m : table) {
            if (m.name == name) return m;
            names += (names.empty() ? "" : ", ") + std::string(m.name);
        }
    }
    throw std::runtime_error(fmt::format("--mode must be one of {}, got {}", names, name));
}

/// --accumulate's value (tensor_core::parse_accumulation: exact, v100, a100, ada, h100, h100-fast,
/// b200, amx, b200-f8f6f4, mi100, mi250, mi300, and +tf32 after a GPU with a tf32 unit), checked
/// when the flag is read, before any data loads; std::runtime_error naming every choice otherwise.
inline scalify::tensor_core::accumulation_choice parse_accumulate(std::string_view text)
{
    try {
        return scalify::tensor_core::parse_accumulation(text);
    } catch (const scalify::config_error& e) {
        throw std::runtime_error(fmt::format("--accumulate: {}", e.what()));
    }
}

/// Reads `--inspect` (report the first step instead of training) or `--inspect=FILE` (also write
/// the report there as CSV) into `inspect` and `csv`; false for any other flag.
inline bool read_inspect_flag(std::string_view flag, bool& inspect, std::string& csv)
{
    constexpr std::string_view name = "--inspect";
    if (flag.substr(0, name.size()) != name || (flag.size() > name.size() && flag[name.size()] != '=')) return false;
    if (flag.size() == name.size() + 1) throw std::runtime_error("--inspect= needs a file name (or use --inspect alone)");
    inspect = true;
    csv = flag.size() > name.size() ? std::string(flag.substr(name.size() + 1)) : std::string();
    return true;
}

}  // namespace examples
