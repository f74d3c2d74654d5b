// tensor_core_match: how many captured tensor-core outputs the scalify::tensor_core models
// reproduce bit for bit, per file and per input class.
//
//   tensor_core_match FILE...        tile files (wgmma_*.bin, mma_*.bin, probe_*.bin) and cuBLASLt
//                                    record files (gemm_*.bin), as reference/mma/ holds them, and
//                                    packed public sets (<GPU>_<format>_fp32.bin, written by
//                                    tools/pack_tensor_core_public.py), each through its GPU's unit
//
// For comparison it also counts the outputs that equal plain float32 arithmetic: for tiles, the
// sum computed in double and rounded once to float32 (the correctly rounded sum wherever double
// holds the sum exactly, as it does for nearly every tile); for cuBLASLt records, scalify's
// default matmul (float32 accumulation through Eigen). Exit status 1 when a model misses any
// output, so scripts can use it as a check.
#include "mma_capture.hpp"
#include "tensor_core_public.hpp"

#include <scalify/scalify.hpp>

#include <fmt/format.h>

#include <bit>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <vector>

namespace {

using mma_capture::tally;

double percent(const tally& t) { return t.outputs == 0 ? 0.0 : 100.0 * static_cast<double>(t.equal) / static_cast<double>(t.outputs); }

std::string rate(const tally& t) { return fmt::format("{:>8}/{:<8} {:8.3f}%", t.equal, t.outputs, percent(t)); }

template <class TA, class TB>
std::array<tally, 5> float32_baseline_as(const mma_capture::tile_file& f)
{
    std::array<tally, 5> per_class{};
    for (std::size_t t = 0; t < f.tiles; ++t) {
        for (std::size_t i = 0; i < 16; ++i) {
            for (std::size_t j = 0; j < 8; ++j) {
                double sum = f.c(t, i, j);
                for (std::size_t p = 0; p < f.k; ++p) {
                    sum += static_cast<double>(static_cast<float>(mma_capture::from_code<TA>(f.a(t, i, p)))) *
                           static_cast<double>(static_cast<float>(mma_capture::from_code<TB>(f.b(t, j, p))));
                }
                per_class[static_cast<std::size_t>(f.input_class(t))].add(
                    std::bit_cast<std::uint32_t>(static_cast<float>(sum)) == f.d(t, i, j));
            }
        }
    }
    return per_class;
}

std::array<tally, 5> float32_baseline(const mma_capture::tile_file& f)
{
    using namespace scalify;
    if (f.kind == "e4m3_e4m3") return float32_baseline_as<float8_e4m3fn, float8_e4m3fn>(f);
    if (f.kind == "e4m3_e5m2") return float32_baseline_as<float8_e4m3fn, float8_e5m2>(f);
    if (f.kind == "e5m2_e4m3") return float32_baseline_as<float8_e5m2, float8_e4m3fn>(f);
    if (f.kind == "e5m2_e5m2") return float32_baseline_as<float8_e5m2, float8_e5m2>(f);
    if (f.kind == "f16") return float32_baseline_as<Eigen::half, Eigen::half>(f);
    return float32_baseline_as<Eigen::bfloat16, Eigen::bfloat16>(f);
}

/// D0 and D1 against scalify's default float32 matmul.
template <class TA, class TB>
mma_capture::gemm_match exact_baseline_as(const mma_capture::gemm_record& r)
{
    using namespace scalify;
    auto a = xt::xarray<TA>::from_shape({r.m, r.k});
    auto b = xt::xarray<TB>::from_shape({r.k, r.n});
    for (std::size_t i = 0; i < r.m * r.k; ++i) a.data()[i] = mma_capture::from_code<TA>(r.a[i]);
    for (std::size_t j = 0; j < r.n; ++j)
        for (std::size_t p = 0; p < r.k; ++p) b(p, j) = mma_capture::from_code<TB>(r.bt[j * r.k + p]);
    const auto d = matmul<natural_scaling, float>(as_scaled_array(a), as_scaled_array(b), tensor_core::exact_accumulation{});
    mma_capture::gemm_match out;
    for (std::size_t i = 0; i < r.m * r.n; ++i) {
        const auto bits = std::bit_cast<std::uint32_t>(d.data().data()[i]);
        out.fast0.add(bits == r.d0[i]);
        out.fast1.add(bits == r.d1[i]);
    }
    return out;
}

mma_capture::gemm_match exact_baseline(const mma_capture::gemm_record& r)
{
    using namespace scalify;
    if (r.a_format == "e4m3" && r.b_format == "e4m3") return exact_baseline_as<float8_e4m3fn, float8_e4m3fn>(r);
    if (r.a_format == "e4m3") return exact_baseline_as<float8_e4m3fn, float8_e5m2>(r);
    if (r.b_format == "e4m3") return exact_baseline_as<float8_e5m2, float8_e4m3fn>(r);
    return exact_baseline_as<float8_e5m2, float8_e5m2>(r);
}

/// Lines of a packed public set whose D is the correctly rounded (nearest even) float32 of the
/// sum, computed in double (exact for these formats and K; C = 0 where the set was captured so).
template <class T>
tally correctly_rounded_as(const tensor_core_public::vector_set& s)
{
    tally t;
    for (std::size_t i = 0; i < s.lines; ++i) {
        double sum = s.zero_c() ? 0.0 : static_cast<double>(std::bit_cast<float>(s.word(i, 0)));
        for (std::size_t p = 0; p < s.k; ++p) {
            sum += static_cast<double>(static_cast<float>(tensor_core_public::from_code<T>(s.code(i, 0, p)))) *
                   static_cast<double>(static_cast<float>(tensor_core_public::from_code<T>(s.code(i, 1, p))));
        }
        t.add(std::bit_cast<std::uint32_t>(static_cast<float>(sum)) == s.word(i, 1));
    }
    return t;
}

tally correctly_rounded(const tensor_core_public::vector_set& s)
{
    using namespace scalify;
    if (s.format == "fp16") return correctly_rounded_as<Eigen::half>(s);
    if (s.format == "bf16") return correctly_rounded_as<Eigen::bfloat16>(s);
    if (s.format == "E4M3") return correctly_rounded_as<float8_e4m3fn>(s);
    return correctly_rounded_as<float8_e5m2>(s);
}

bool is_record_file(const std::string& path)
{
    const auto slash = path.find_last_of('/');
    return path.compare(slash == std::string::npos ? 0 : slash + 1, 5, "gemm_") == 0;
}

}  // namespace

int main(int argc, char** argv)
{
    if (argc < 2) {
        std::fprintf(stderr, "usage: tensor_core_match FILE...  (tile files wgmma_*.bin, mma_*.bin, probe_*.bin; "
                             "cuBLASLt record files gemm_*.bin; packed public sets <GPU>_<format>_fp32.bin)\n");
        return 2;
    }
    bool all_match = true;
    try {
        for (int i = 1; i < argc; ++i) {
            const std::string path = argv[i];
            if (tensor_core_public::is_packed_set(path)) {
                const auto set = tensor_core_public::read_set_file(path);
                const auto model = tensor_core_public::match_unit(set);
                const tally model_tally{model.lines, model.equal};
                fmt::print("{} ({} {}, {} lines of K = {}{})\n  {:>28} | {:>28}\n  {:>28} | {:>28}\n", path, set.gpu,
                           set.format, set.lines, set.k, set.zero_c() ? ", C = 0" : "", "dot<" + model.model + ">",
                           "double sum, rounded to float32", rate(model_tally), rate(correctly_rounded(set)));
                if (!model.first_miss.empty()) fmt::print("  first miss: {}\n", model.first_miss);
                all_match = all_match && model.equal == model.lines;
            } else if (is_record_file(path)) {
                // Per distribution and K: D0 vs h100_cublaslt_fp8, D1 vs h100_cublaslt_fp8_fast.
                fmt::print("{}\n  {:<32} {:>28} {:>28} | {:>28} {:>28}\n", path, "record (a x b, K, dist)",
                           "D0 = gemm<h100_cublaslt_fp8>", "D1 = gemm<..._fast>", "D0 = exact float32", "D1 = exact float32");
                std::map<std::string, std::array<tally, 4>> per_dist;
                for (const auto& r : mma_capture::read_gemm_file(path)) {
                    const auto model = mma_capture::match_gemm(r);
                    const auto exact = exact_baseline(r);
                    fmt::print("  {:<32} {:>28} {:>28} | {:>28} {:>28}\n",
                               fmt::format("{}x{} K={} {}", r.a_format, r.b_format, r.k, r.dist), rate(model.fast0),
                               rate(model.fast1), rate(exact.fast0), rate(exact.fast1));
                    auto& d = per_dist[r.dist];
                    d[0] += model.fast0;
                    d[1] += model.fast1;
                    d[2] += exact.fast0;
                    d[3] += exact.fast1;
                    all_match = all_match && model.fast0.equal == model.fast0.outputs && model.fast1.equal == model.fast1.outputs;
                }
                std::array<tally, 4> total{};
                for (const auto& [dist, d] : per_dist) {
                    fmt::print("  {:<32} {:>28} {:>28} | {:>28} {:>28}\n", "all K, dist=" + dist, rate(d[0]), rate(d[1]),
                               rate(d[2]), rate(d[3]));
                    for (std::size_t c = 0; c < 4; ++c) total[c] += d[c];
                }
                fmt::print("  {:<32} {:>28} {:>28} | {:>28} {:>28}\n", "file", rate(total[0]), rate(total[1]),
                           rate(total[2]), rate(total[3]));
            } else {
                const auto file = mma_capture::read_tile_file(path);
                const auto model = mma_capture::match_tiles(file);
                const auto baseline = float32_baseline(file);
                const bool qgmma = file.kind.find('e') == 0;
                fmt::print("{} ({}, {} tiles)\n  {:<12} {:>28} | {:>28}\n", path, file.kind, file.tiles, "class",
                           qgmma ? "dot<h100_qgmma>" : "dot<h100_hmma>", "double sum, rounded to float32");
                tally model_total, baseline_total;
                for (std::size_t c = 0; c < 5; ++c) {
                    fmt::print("  {:<12} {:>28} | {:>28}\n", mma_capture::class_names[c], rate(model[c]), rate(baseline[c]));
                    model_total += model[c];
                    baseline_total += baseline[c];
                    all_match = all_match && model[c].equal == model[c].outputs;
                }
                fmt::print("  {:<12} {:>28} | {:>28}\n", "file", rate(model_total), rate(baseline_total));
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tensor_core_match: %s\n", e.what());
        return 2;
    }
    fmt::print("{}\n", all_match ? "every output reproduced bit for bit" : "SOME OUTPUTS DIFFER");
    return all_match ? 0 : 1;
}
