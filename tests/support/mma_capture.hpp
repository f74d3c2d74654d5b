#pragma once
// Readers for the H100 tensor-core captures (tests/data/mma/, the shared reference/mma/ files and
// what tools/tensor_core_probe writes) and the comparison of every captured output with the
// scalify::tensor_core models. Used by the unit test (vendored subset), by tools/tensor_core_match
// (any capture, per-file and per-class match rates) and by the CUDA probe.
//
// Tile files: a 256-byte ASCII header of key=value words (kind, K, elem_bytes, tiles, tile_bytes),
// then records of A (16 x K codes, row-major), B (8 columns of K codes), C and D (16 x 8 float32,
// row-major). cuBLASLt files: records of a header line 'case a=.. b=.. K=.. M=.. N=.. dist=..',
// then A (M x K codes), BT (N x K codes), D0 (use_fast_accum=False), D1 (True), M x N float32 each.
#include "gemm_reference.hpp"

#include <scalify/tensor_core.hpp>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mma_capture {

inline std::map<std::string, std::string> key_values(const std::string& text)
{
    std::map<std::string, std::string> out;
    std::istringstream words(text);
    std::string word;
    while (words >> word) {
        const auto eq = word.find('=');
        if (eq != std::string::npos) out[word.substr(0, eq)] = word.substr(eq + 1);
    }
    return out;
}

inline std::vector<std::uint8_t> read_bytes(const std::string& path)
{
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::uint32_t load_u32(const std::uint8_t* p)
{
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

/// The five input classes of the capture (probe/mma_probe.cu, gen_tile).
inline constexpr std::array<const char*, 5> class_names{"uniform", "narrow", "dominant", "cancel", "subnormal"};

struct tile_file {
    std::string header;
    std::string kind;  // e4m3_e4m3, e4m3_e5m2, e5m2_e4m3, e5m2_e5m2, f16, bf16
    bool wgmma = false;  // groups of 4 tiles share B; class = (t / 4) % 5, else t % 5
    std::size_t k = 0, elem_bytes = 0, tile_bytes = 0, tiles = 0;
    std::vector<std::uint8_t> bytes;  // the tiles, header removed

    [[nodiscard]] const std::uint8_t* tile(std::size_t t) const { return bytes.data() + t * tile_bytes; }
    [[nodiscard]] unsigned code(const std::uint8_t* p, std::size_t i) const
    {
        return elem_bytes == 1 ? p[i] : static_cast<unsigned>(p[2 * i] | p[2 * i + 1] << 8);
    }
    [[nodiscard]] unsigned a(std::size_t t, std::size_t row, std::size_t kk) const { return code(tile(t), row * k + kk); }
    [[nodiscard]] unsigned b(std::size_t t, std::size_t col, std::size_t kk) const
    {
        return code(tile(t) + 16 * k * elem_bytes, col * k + kk);
    }
    [[nodiscard]] float c(std::size_t t, std::size_t row, std::size_t col) const
    {
        return std::bit_cast<float>(load_u32(tile(t) + 24 * k * elem_bytes + 4 * (row * 8 + col)));
    }
    [[nodiscard]] std::uint32_t d(std::size_t t, std::size_t row, std::size_t col) const
    {
        return load_u32(tile(t) + 24 * k * elem_bytes + 512 + 4 * (row * 8 + col));
    }
    [[nodiscard]] int input_class(std::size_t t) const { return static_cast<int>((wgmma ? t / 4 : t) % 5); }
};

inline tile_file read_tile_file(const std::string& path)
{
    auto bytes = read_bytes(path);
    if (bytes.size() < 256) throw std::runtime_error(path + ": shorter than the 256-byte header");
    tile_file f;
    f.header.assign(bytes.begin(), bytes.begin() + 256);
    const auto keys = key_values(f.header);
    f.kind = keys.at("kind");
    f.k = std::stoul(keys.at("K"));
    f.elem_bytes = std::stoul(keys.at("elem_bytes"));
    f.tile_bytes = std::stoul(keys.at("tile_bytes"));
    f.wgmma = f.header.find("wgmma") != std::string::npos;
    if (f.tile_bytes != 24 * f.k * f.elem_bytes + 1024) throw std::runtime_error(path + ": tile_bytes does not fit K");
    f.tiles = (bytes.size() - 256) / f.tile_bytes;
    if (keys.count("tiles") && std::stoul(keys.at("tiles")) != f.tiles) throw std::runtime_error(path + ": tile count");
    f.bytes.assign(bytes.begin() + 256, bytes.begin() + 256 + static_cast<std::ptrdiff_t>(f.tiles * f.tile_bytes));
    return f;
}

struct gemm_record {
    std::string header, a_format, b_format, dist;
    std::size_t m = 0, k = 0, n = 0;
    std::vector<std::uint8_t> a, bt;       // codes
    std::vector<std::uint32_t> d0, d1;     // float32 bits: default and fast accumulation
};

inline std::vector<gemm_record> read_gemm_file(const std::string& path)
{
    const auto bytes = read_bytes(path);
    std::vector<gemm_record> out;
    std::size_t p = 0;
    while (p < bytes.size()) {
        std::size_t eol = p;
        while (eol < bytes.size() && bytes[eol] != '\n') ++eol;
        gemm_record r;
        r.header.assign(bytes.begin() + static_cast<std::ptrdiff_t>(p), bytes.begin() + static_cast<std::ptrdiff_t>(eol));
        const auto keys = key_values(r.header);
        r.a_format = keys.at("a");
        r.b_format = keys.at("b");
        r.dist = keys.at("dist");
        r.m = std::stoul(keys.at("M"));
        r.k = std::stoul(keys.at("K"));
        r.n = std::stoul(keys.at("N"));
        p = eol + 1;
        const std::size_t need = r.m * r.k + r.n * r.k + 8 * r.m * r.n;
        if (p + need > bytes.size()) throw std::runtime_error(path + ": record '" + r.header + "' is truncated");
        const auto at = [&](std::size_t offset) { return bytes.begin() + static_cast<std::ptrdiff_t>(offset); };
        r.a.assign(at(p), at(p + r.m * r.k));
        p += r.m * r.k;
        r.bt.assign(at(p), at(p + r.n * r.k));
        p += r.n * r.k;
        r.d0.resize(r.m * r.n);
        r.d1.resize(r.m * r.n);
        for (auto& v : r.d0) v = load_u32(&bytes[std::exchange(p, p + 4)]);
        for (auto& v : r.d1) v = load_u32(&bytes[std::exchange(p, p + 4)]);
        out.push_back(std::move(r));
    }
    return out;
}

/// Outputs compared and outputs equal, bit for bit.
struct tally {
    std::size_t outputs = 0, equal = 0;
    void add(bool same) { ++outputs; equal += same ? 1 : 0; }
    tally& operator+=(const tally& o) { outputs += o.outputs; equal += o.equal; return *this; }
};

using scalify::testing::from_code;

/// Every output of every tile through dot<Model>; per input class.
template <class Model, class TA, class TB>
std::array<tally, 5> match_tiles_as(const tile_file& f)
{
    std::array<tally, 5> per_class{};
    std::vector<TA> a(f.k);
    std::vector<TB> b(f.k);
    for (std::size_t t = 0; t < f.tiles; ++t) {
        for (std::size_t i = 0; i < 16; ++i) {
            for (std::size_t kk = 0; kk < f.k; ++kk) a[kk] = from_code<TA>(f.a(t, i, kk));
            for (std::size_t j = 0; j < 8; ++j) {
                for (std::size_t kk = 0; kk < f.k; ++kk) b[kk] = from_code<TB>(f.b(t, j, kk));
                const float d = scalify::tensor_core::dot<Model>(a, b, f.c(t, i, j));
                per_class[static_cast<std::size_t>(f.input_class(t))].add(std::bit_cast<std::uint32_t>(d) == f.d(t, i, j));
            }
        }
    }
    return per_class;
}

/// A tile file's outputs against the model of its instruction (QGMMA for fp8 kinds, HMMA else).
inline std::array<tally, 5> match_tiles(const tile_file& f)
{
    using namespace scalify;
    using tensor_core::h100_hmma;
    using tensor_core::h100_qgmma;
    if (f.kind == "e4m3_e4m3") return match_tiles_as<h100_qgmma, float8_e4m3fn, float8_e4m3fn>(f);
    if (f.kind == "e4m3_e5m2") return match_tiles_as<h100_qgmma, float8_e4m3fn, float8_e5m2>(f);
    if (f.kind == "e5m2_e4m3") return match_tiles_as<h100_qgmma, float8_e5m2, float8_e4m3fn>(f);
    if (f.kind == "e5m2_e5m2") return match_tiles_as<h100_qgmma, float8_e5m2, float8_e5m2>(f);
    if (f.kind == "f16") return match_tiles_as<h100_hmma, Eigen::half, Eigen::half>(f);
    if (f.kind == "bf16") return match_tiles_as<h100_hmma, Eigen::bfloat16, Eigen::bfloat16>(f);
    throw std::runtime_error("unknown tile kind " + f.kind);
}

/// D0 against gemm<h100_cublaslt_fp8>, D1 against gemm<h100_cublaslt_fp8_fast>.
struct gemm_match {
    tally fast0, fast1;
};

template <class TA, class TB>
gemm_match match_gemm_as(const gemm_record& r)
{
    using namespace scalify;
    xt::xarray<TA> a = xt::xarray<TA>::from_shape({r.m, r.k});
    xt::xarray<TB> b = xt::xarray<TB>::from_shape({r.k, r.n});
    for (std::size_t i = 0; i < r.m * r.k; ++i) a.data()[i] = from_code<TA>(r.a[i]);
    for (std::size_t j = 0; j < r.n; ++j)
        for (std::size_t kk = 0; kk < r.k; ++kk) b(kk, j) = from_code<TB>(r.bt[j * r.k + kk]);
    const xt::xarray<float> d0 = tensor_core::gemm<tensor_core::h100_cublaslt_fp8>(a, b);
    const xt::xarray<float> d1 = tensor_core::gemm<tensor_core::h100_cublaslt_fp8_fast>(a, b);
    gemm_match out;
    for (std::size_t i = 0; i < r.m * r.n; ++i) {
        out.fast0.add(std::bit_cast<std::uint32_t>(d0.data()[i]) == r.d0[i]);
        out.fast1.add(std::bit_cast<std::uint32_t>(d1.data()[i]) == r.d1[i]);
    }
    return out;
}

inline gemm_match match_gemm(const gemm_record& r)
{
    using namespace scalify;
    const bool a4 = r.a_format == "e4m3", b4 = r.b_format == "e4m3";
    if ((!a4 && r.a_format != "e5m2") || (!b4 && r.b_format != "e5m2")) {
        throw std::runtime_error("unknown formats in '" + r.header + "'");
    }
    if (a4 && b4) return match_gemm_as<float8_e4m3fn, float8_e4m3fn>(r);
    if (a4) return match_gemm_as<float8_e4m3fn, float8_e5m2>(r);
    if (b4) return match_gemm_as<float8_e5m2, float8_e4m3fn>(r);
    return match_gemm_as<float8_e5m2, float8_e5m2>(r);
}

}  // namespace mma_capture
