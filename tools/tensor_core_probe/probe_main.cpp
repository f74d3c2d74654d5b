// tensor_core_probe: captures tensor-core tiles on this machine's GPU and prints how many outputs
// the scalify::tensor_core models reproduce bit for bit (per operand pair and input class).
//
//   tensor_core_probe [OUTDIR] [--tiles N]      (default: OUTDIR = ., N = 1000 per pair)
//
// Pairs: f16 and bf16 (mma.sync.m16n8k16, sm_80 and later) and the four fp8 pairs
// (mma.sync.m16n8k32, sm_89 and later). Each pair is first run on small integers, whose sums every
// unit computes exactly (a wrong fragment layout fails there), then on N tiles in the capture's
// five input classes. The tiles are written as OUTDIR/probe_<pair>.bin in the capture's tile
// format, so tools/tensor_core_match and a refit of F and P can read them. The models are the
// H100's (QGMMA F = 13, P = 14; HMMA F = 25, P = 24): other GPUs may differ, which is what this
// program is for. Not run on hardware by its author (no GPU was available); see
// docs/tensor_core.md.
#include "mma_capture.hpp"
#include "probe_kernels.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

/// An element format by its fields (e4m3fn: no inf, the all-ones code is NaN; the rest IEEE).
struct element_format {
    int exponent_bits, mantissa_bits, bias;
    bool ieee;
    [[nodiscard]] int max_field() const { return (1 << exponent_bits) - (ieee ? 2 : 1); }
    [[nodiscard]] unsigned code(bool negative, int field, unsigned mantissa) const
    {
        field = std::max(0, std::min(field, max_field()));
        mantissa &= (1u << mantissa_bits) - 1;
        if (!ieee && field == max_field() && mantissa == (1u << mantissa_bits) - 1) --mantissa;  // skip NaN
        return (negative ? 1u << (exponent_bits + mantissa_bits) : 0u) | static_cast<unsigned>(field) << mantissa_bits |
               mantissa;
    }
    [[nodiscard]] double value(unsigned code) const
    {
        const int field = static_cast<int>(code >> mantissa_bits) & ((1 << exponent_bits) - 1);
        const unsigned mantissa = code & ((1u << mantissa_bits) - 1);
        const double v = field == 0 ? std::ldexp(mantissa, 1 - bias - mantissa_bits)
                                    : std::ldexp(mantissa | (1u << mantissa_bits), field - bias - mantissa_bits);
        return (code >> (exponent_bits + mantissa_bits)) & 1 ? -v : v;
    }
};

constexpr element_format e4m3{4, 3, 7, false}, e5m2{5, 2, 15, true}, f16{5, 10, 15, true}, bf16{8, 7, 127, true};

element_format format_a(probe::kind k)
{
    switch (k) {
    case probe::kind::e4m3_e4m3:
    case probe::kind::e4m3_e5m2: return e4m3;
    case probe::kind::e5m2_e4m3:
    case probe::kind::e5m2_e5m2: return e5m2;
    case probe::kind::f16: return f16;
    default: return bf16;
    }
}

element_format format_b(probe::kind k)
{
    switch (k) {
    case probe::kind::e4m3_e4m3:
    case probe::kind::e5m2_e4m3: return e4m3;
    case probe::kind::e4m3_e5m2:
    case probe::kind::e5m2_e5m2: return e5m2;
    case probe::kind::f16: return f16;
    default: return bf16;
    }
}

struct tile_writer {
    probe::kind k;
    std::uint8_t* p;
    void put(std::size_t offset_elements, unsigned code) const
    {
        if (probe::element_bytes(k) == 1) {
            p[offset_elements] = static_cast<std::uint8_t>(code);
        } else {
            const auto v = static_cast<std::uint16_t>(code);
            std::memcpy(p + 2 * offset_elements, &v, 2);
        }
    }
    void a(std::size_t row, std::size_t kk, unsigned code) const { put(row * probe::k_of(k) + kk, code); }
    void b(std::size_t col, std::size_t kk, unsigned code) const { put(16 * probe::k_of(k) + col * probe::k_of(k) + kk, code); }
    void c(std::size_t row, std::size_t col, float value) const
    {
        std::memcpy(p + 24 * probe::k_of(k) * probe::element_bytes(k) + 4 * (row * 8 + col), &value, 4);
    }
};

/// One tile of input class `cls` (as the H100 capture: uniform codes, a narrow exponent band, one
/// dominant term, cancelling pairs, subnormals), C zero / near / far above / far below the
/// largest product.
void generate(probe::kind k, int cls, std::uint8_t* tile, std::mt19937_64& rng)
{
    const element_format fa = format_a(k), fb = format_b(k);
    const std::size_t K = probe::k_of(k);
    const tile_writer w{k, tile};
    const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    const auto coin = [&] { return pick(0, 1) == 1; };
    const auto any = [&](const element_format& f) {
        return f.code(coin(), pick(0, f.max_field()), static_cast<unsigned>(rng()));
    };
    std::vector<unsigned> A(16 * K), B(8 * K);
    const bool wide = probe::element_bytes(k) == 2;
    if (cls == 0) {
        for (auto& x : A) x = any(fa);
        for (auto& x : B) x = any(fb);
    } else if (cls == 1) {
        const int ca = wide ? fa.bias + pick(-6, 6) : pick(2, fa.max_field() - 2);
        const int cb = wide ? fb.bias + pick(-6, 6) : pick(2, fb.max_field() - 2);
        for (auto& x : A) x = fa.code(coin(), ca + pick(-2, 2), static_cast<unsigned>(rng()));
        for (auto& x : B) x = fb.code(coin(), cb + pick(-2, 2), static_cast<unsigned>(rng()));
    } else if (cls == 2) {
        const int ta = wide ? fa.bias + 4 : fa.max_field() - 1, tb = wide ? fb.bias + 4 : fb.max_field() - 1;
        for (std::size_t i = 0; i < 16; ++i)
            for (std::size_t kk = 0; kk < K; ++kk)
                A[i * K + kk] = fa.code(coin(), ta - (kk == i % K ? 0 : pick(1, wide ? 20 : fa.max_field() - 1)),
                                        static_cast<unsigned>(rng()));
        for (auto& x : B) x = fb.code(coin(), tb - pick(0, wide ? 12 : 3), static_cast<unsigned>(rng()));
    } else if (cls == 3) {
        const unsigned sign_a = 1u << (fa.exponent_bits + fa.mantissa_bits);
        for (std::size_t i = 0; i < 16; ++i)
            for (std::size_t kk = 0; kk < K; kk += 2) {
                A[i * K + kk] = any(fa);
                A[i * K + kk + 1] = pick(0, 3) == 0 ? any(fa) : A[i * K + kk] ^ sign_a;
            }
        for (std::size_t j = 0; j < 8; ++j)
            for (std::size_t kk = 0; kk < K; kk += 2) B[j * K + kk] = B[j * K + kk + 1] = any(fb);
    } else {
        for (auto& x : A) x = coin() ? fa.code(coin(), pick(0, 2), static_cast<unsigned>(rng())) : any(fa);
        for (auto& x : B) x = coin() ? fb.code(coin(), pick(0, 2), static_cast<unsigned>(rng())) : any(fb);
    }
    const int c_mode = pick(0, 3);
    for (std::size_t i = 0; i < 16; ++i) {
        for (std::size_t kk = 0; kk < K; ++kk) w.a(i, kk, A[i * K + kk]);
        for (std::size_t j = 0; j < 8; ++j) {
            double largest = 0;
            for (std::size_t kk = 0; kk < K; ++kk)
                largest = std::max(largest, std::abs(fa.value(A[i * K + kk]) * fb.value(B[j * K + kk])));
            if (largest == 0) largest = 1;
            const int shift = c_mode == 2 ? 20 : c_mode == 3 ? -20 : 0;
            const float c = c_mode == 0 ? 0.0f
                                        : static_cast<float>((coin() ? -1 : 1) * std::ldexp(largest, shift + pick(-4, 4)) *
                                                             std::uniform_real_distribution<double>(1.0, 2.0)(rng));
            w.c(i, j, std::isfinite(c) ? c : 0.0f);
        }
    }
    for (std::size_t j = 0; j < 8; ++j)
        for (std::size_t kk = 0; kk < K; ++kk) w.b(j, kk, B[j * K + kk]);
}

/// Small integers in [-4, 4] and an integer C: every unit sums them exactly.
bool self_check(probe::kind k, std::mt19937_64& rng, std::string& error)
{
    const element_format fa = format_a(k), fb = format_b(k);
    const std::size_t K = probe::k_of(k), count = 64, bytes = probe::tile_bytes(k);
    std::vector<std::uint8_t> tiles(bytes * count, 0);
    std::vector<double> want(count * 128);
    const auto small = [&](const element_format& f, int& value) {
        value = std::uniform_int_distribution<int>(-4, 4)(rng);
        const int m = std::abs(value);
        if (m == 0) return 0u;
        const int e = m >= 4 ? 2 : m >= 2 ? 1 : 0;
        return f.code(value < 0, e + f.bias, static_cast<unsigned>((m - (1 << e)) << f.mantissa_bits) >> e);
    };
    for (std::size_t t = 0; t < count; ++t) {
        const tile_writer w{k, tiles.data() + t * bytes};
        std::vector<int> av(16 * K), bv(8 * K);
        for (std::size_t i = 0; i < 16 * K; ++i) w.a(i / K, i % K, small(fa, av[i]));
        for (std::size_t i = 0; i < 8 * K; ++i) w.b(i / K, i % K, small(fb, bv[i]));
        for (std::size_t i = 0; i < 16; ++i)
            for (std::size_t j = 0; j < 8; ++j) {
                const int c = std::uniform_int_distribution<int>(-100, 100)(rng);
                w.c(i, j, static_cast<float>(c));
                double sum = c;
                for (std::size_t kk = 0; kk < K; ++kk) sum += av[i * K + kk] * bv[j * K + kk];
                want[t * 128 + i * 8 + j] = sum;
            }
    }
    if (!probe::run_tiles(k, tiles.data(), count, error)) return false;
    for (std::size_t t = 0; t < count; ++t)
        for (std::size_t i = 0; i < 128; ++i) {
            float d;
            std::memcpy(&d, tiles.data() + t * bytes + bytes - 512 + 4 * i, 4);
            if (static_cast<double>(d) != want[t * 128 + i]) {
                error = fmt::format("self-check: tile {} output {} is {}, the exact sum is {} (fragment layout?)", t, i, d,
                                    want[t * 128 + i]);
                return false;
            }
        }
    return true;
}

}  // namespace

int main(int argc, char** argv)
{
    std::string out_dir = ".";
    std::size_t count = 1000;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--tiles" && i + 1 < argc) count = std::stoul(argv[++i]);
        else if (arg == "--help" || arg == "-h") {
            std::printf("usage: tensor_core_probe [OUTDIR] [--tiles N]\n");
            return 0;
        } else out_dir = arg;
    }
    probe::device_info device;
    std::string error;
    if (!probe::query_device(device, error)) {
        std::fprintf(stderr, "tensor_core_probe: %s\n", error.c_str());
        return 2;
    }
    const int sm = device.major * 10 + device.minor;
    fmt::print("{} (sm_{}), {} tiles per pair, files in {}\n", device.name, sm, count, out_dir);
    std::mt19937_64 rng(20260101);
    bool all = true;
    for (int i = 0; i < 6; ++i) {
        const auto k = static_cast<probe::kind>(i);
        if (sm < (probe::is_fp8(k) ? 89 : 80)) {
            fmt::print("{:<10} skipped: needs sm_{}\n", probe::kind_name(k), probe::is_fp8(k) ? 89 : 80);
            continue;
        }
        if (!self_check(k, rng, error)) {
            std::fprintf(stderr, "%s: %s\n", probe::kind_name(k), error.c_str());
            return 1;
        }
        const std::size_t bytes = probe::tile_bytes(k);
        std::vector<std::uint8_t> tiles(bytes * count, 0);
        for (std::size_t t = 0; t < count; ++t) generate(k, static_cast<int>(t % 5), tiles.data() + t * bytes, rng);
        if (!probe::run_tiles(k, tiles.data(), count, error)) {
            std::fprintf(stderr, "%s: %s\n", probe::kind_name(k), error.c_str());
            return 1;
        }
        // The capture's tile format: a 256-byte header, then the records.
        std::string header = fmt::format("scalify-tensor-core-probe v1 kind={} instr=mma.sync.m16n8k{}.f32 K={} elem_bytes={} "
                                         "tiles={} tile_bytes={} layout=A16xK_rowmajor,B_Kx8_colmajor,C16x8_f32,D16x8_f32 sm={}",
                                         probe::kind_name(k), probe::k_of(k), probe::k_of(k), probe::element_bytes(k), count,
                                         bytes, sm);
        header.resize(255, ' ');
        header += '\n';
        const std::string path = out_dir + "/probe_" + probe::kind_name(k) + ".bin";
        std::ofstream(path, std::ios::binary).write(header.data(), 256).write(reinterpret_cast<const char*>(tiles.data()),
                                                                             static_cast<std::streamsize>(tiles.size()));
        const auto per_class = mma_capture::match_tiles(mma_capture::read_tile_file(path));
        mma_capture::tally total;
        std::string line;
        for (std::size_t c = 0; c < per_class.size(); ++c) {
            total += per_class[c];
            line += fmt::format("  {} {:.2f}%", mma_capture::class_names[c],
                                100.0 * static_cast<double>(per_class[c].equal) / static_cast<double>(per_class[c].outputs));
        }
        fmt::print("{:<10} {} {}/{} outputs bit for bit ({:.3f}%):{}\n", probe::kind_name(k),
                   probe::is_fp8(k) ? "dot<h100_qgmma>" : "dot<h100_hmma> ", total.equal, total.outputs,
                   100.0 * static_cast<double>(total.equal) / static_cast<double>(total.outputs), line);
        all = all && total.equal == total.outputs;
    }
    fmt::print("{}\n", all ? "the H100 models reproduce this GPU" : "this GPU differs from the H100 models somewhere");
    return 0;
}
