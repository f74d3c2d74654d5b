// tensor_core_amx: Intel AMX TDPBF16PS (amx_bf16) and AVX512_BF16 VDPBF16PS (avx512_bf16) against
// every vendored vector of the hardware capture (tests/data/amx/, README there), bit for bit, NaN
// payloads included; the rules the capture rejects; the special cases by hand; the GEMM chains
// against loops of their instruction. AMX-FP16 TDPFP16PS (amx_fp16, not captured): the fp16
// widening, the special cases of the SDM's rules on the measured TDPBF16PS datapath by hand, and
// its GEMM against loops of the instruction.
#include <scalify/scalify.hpp>
#include <scalify/tensor_core/amx.hpp>

#include "../support/gemm_reference.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace tc_amx {

using namespace scalify;
namespace tc = scalify::tensor_core;
namespace fc = scalify::tensor_core::detail::fma_chain;
using bf16 = Eigen::bfloat16;

struct amx_vector {
    std::string instruction, kind;
    std::uint32_t c = 0, d = 0;
    std::vector<bf16> a, b;
};

struct amx_capture {
    std::vector<std::string> header;
    std::vector<amx_vector> lines;
};

inline bf16 from_code(unsigned code) { return std::bit_cast<bf16>(static_cast<std::uint16_t>(code)); }
inline std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float from_bits(std::uint32_t x) { return std::bit_cast<float>(x); }
inline std::uint32_t code_of(bf16 x) { return std::bit_cast<std::uint16_t>(x); }

inline amx_capture read_capture()
{
    std::ifstream in(std::string(SCALIFY_TEST_DATA_DIR) + "/amx/amx_bf16_xeon.txt");
    REQUIRE(in.good());
    amx_capture capture;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        if (line[0] == '#') {
            capture.header.push_back(line);
            continue;
        }
        std::istringstream s(line);
        amx_vector v;
        std::size_t k = 0;
        s >> v.instruction >> v.kind >> k >> std::hex >> v.c;
        v.a.resize(k);
        v.b.resize(k);
        unsigned code = 0;
        for (auto& x : v.a) {
            s >> code;
            x = from_code(code);
        }
        for (auto& x : v.b) {
            s >> code;
            x = from_code(code);
        }
        s >> v.d;
        REQUIRE(!s.fail());
        capture.lines.push_back(std::move(v));
    }
    return capture;
}

/// The model's result for a captured line, as float32 bits.
inline std::uint32_t model_bits(const amx_vector& v)
{
    if (v.instruction == "amx_bf16") return bits_of(tc::dot<tc::amx_bf16>(v.a, v.b, from_bits(v.c)));
    return bits_of(tc::dot<tc::avx512_bf16>(v.a, v.b, from_bits(v.c)));
}

/// A rule over widened operands, for the rules the capture rejects.
using rule = std::uint32_t (*)(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b, std::uint32_t c);

template <class T>
inline std::vector<std::uint32_t> widened(const std::vector<T>& x)
{
    std::vector<std::uint32_t> out;
    for (const T v : x) out.push_back(fc::widen(v));
    return out;
}

/// How many lines of `instruction` a rule reproduces bit for bit.
inline int count_matches(const amx_capture& capture, const std::string& instruction, rule r)
{
    int equal = 0;
    for (const amx_vector& v : capture.lines)
        if (v.instruction == instruction && r(widened(v.a), widened(v.b), v.c) == v.d) ++equal;
    return equal;
}

/// The intrinsics guide's order: one chain from C, a[2k] then a[2k+1].
inline std::uint32_t one_chain_even_first(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b,
                                          std::uint32_t c)
{
    for (std::size_t i = 0; i < a.size(); ++i) c = fc::fma(a[i], b[i], c);
    return c;
}
/// The two lanes, added to C one after the other: (c + even) + odd.
inline std::uint32_t lanes_one_after_other(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b,
                                           std::uint32_t c)
{
    std::uint32_t even = 0, odd = 0;
    for (std::size_t i = 0; i + 1 < a.size(); i += 2) {
        even = fc::fma(a[i], b[i], even);
        odd = fc::fma(a[i + 1], b[i + 1], odd);
    }
    return fc::add(fc::add(c, even), odd);
}
/// The measured rule without DAZ on C.
inline std::uint32_t accumulator_not_daz(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b,
                                         std::uint32_t c)
{
    std::uint32_t even = 0, odd = 0;
    for (std::size_t i = 0; i + 1 < a.size(); i += 2) {
        even = fc::fma(a[i], b[i], even);
        odd = fc::fma(a[i + 1], b[i + 1], odd);
    }
    const std::uint32_t s = fc::add(even, odd);
    if (fc::is_zero_or_subnormal(c) && !fc::is_nan(s) && !fc::is_inf(s)) {
        // c + s exactly, as a float32 add with subnormals kept (s is a normal or zero).
        return bits_of(from_bits(c) + from_bits(s));
    }
    return fc::add(c, s);
}
/// VDPBF16PS in the other order: product 0 first.
inline std::uint32_t even_first(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b, std::uint32_t c)
{
    return fc::fma(a[1], b[1], fc::fma(a[0], b[0], c));
}

inline bf16 bf(float x) { return bf16(x); }

using f16 = Eigen::half;
inline f16 hf(float x) { return f16(x); }  // exact for every value used below
inline f16 half_code(unsigned code) { return std::bit_cast<f16>(static_cast<std::uint16_t>(code)); }

/// amx_fp16's result for a and b (the same even length) and C, as float32 bits.
inline std::uint32_t fp16_bits(const std::vector<f16>& a, const std::vector<f16>& b, float c)
{
    return bits_of(tc::dot<tc::amx_fp16>(a, b, c));
}

/// A GEMM as a loop of its Instruction: Instruction::k products per dot, each result the next
/// one's C, from +0; an odd K padded with a zero product.
template <class Instruction, class T>
inline float instruction_loop(std::vector<T> row, std::vector<T> column)
{
    const std::size_t padded = (row.size() + 1) / 2 * 2;
    row.resize(padded, T(0.0f));
    column.resize(padded, T(0.0f));
    float acc = 0.0f;
    for (std::size_t s = 0; s < padded; s += Instruction::k) {
        const std::size_t w = std::min<std::size_t>(Instruction::k, padded - s);
        acc = tc::dot<Instruction>(std::span<const T>(row.data() + s, w), std::span<const T>(column.data() + s, w), acc);
    }
    return acc;
}

/// An m x k operand A and a k x n operand B, each element set by draw(x, line), line being its
/// row of A or its column of B.
template <class T, class Draw>
inline std::pair<xt::xarray<T>, xt::xarray<T>> drawn_operands(std::size_t m, std::size_t k, std::size_t n, Draw&& draw)
{
    xt::xarray<T> a = xt::xarray<T>::from_shape({m, k}), b = xt::xarray<T>::from_shape({k, n});
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t p = 0; p < k; ++p) draw(a(i, p), static_cast<int>(i));
    for (std::size_t p = 0; p < k; ++p)
        for (std::size_t j = 0; j < n; ++j) draw(b(p, j), static_cast<int>(j));
    return {std::move(a), std::move(b)};
}

/// f() with the FPU's rounding mode set to `mode`, the previous one restored.
template <class F>
inline auto under_rounding(int mode, F&& f)
{
    const int previous = std::fegetround();
    std::fesetround(mode);
    auto result = f();
    std::fesetround(previous);
    return result;
}

}  // namespace tc_amx

TEST_CASE("dot<amx_bf16> and dot<avx512_bf16> reproduce every vendored AMX and AVX512_BF16 output", "[tensor_core][amx]")
{
    using namespace tc_amx;
    const amx_capture capture = read_capture();
    // The provenance lines are kept with the data.
    std::string header;
    for (const std::string& h : capture.header) header += h + "\n";
    CHECK(header.find("# cpu: Intel(R) Xeon(R) Processor") != std::string::npos);
    CHECK(header.find("amx_bf16") != std::string::npos);
    CHECK(header.find("0 outputs differed") != std::string::npos);  // MXCSR is not consulted
    CHECK(header.find("# date: 2026-") != std::string::npos);

    std::map<std::string, std::pair<int, int>> counts;  // instruction + class: equal, lines
    std::string first_miss;
    for (const amx_vector& v : capture.lines) {
        const std::uint32_t got = model_bits(v);
        auto& c = counts[v.instruction + " " + v.kind];
        ++c.second;
        if (got == v.d) ++c.first;
        else if (first_miss.empty())
            first_miss = v.instruction + " " + v.kind + " K=" + std::to_string(v.a.size()) + " c=" +
                         std::to_string(v.c) + " want " + std::to_string(v.d) + " got " + std::to_string(got);
    }
    INFO("first miss: " << first_miss);
    int equal = 0, lines = 0, amx_lines = 0;
    for (const auto& [key, c] : counts) {
        INFO(key);
        CHECK(c.first == c.second);
        equal += c.first;
        lines += c.second;
        if (key.rfind("amx_bf16", 0) == 0) amx_lines += c.second;
    }
    CHECK(lines == 1048);
    CHECK(amx_lines == 787);
    CHECK(equal == lines);
}

TEST_CASE("the AMX capture rejects the other orders and the accumulator without DAZ", "[tensor_core][amx]")
{
    using namespace tc_amx;
    const amx_capture capture = read_capture();
    // The measured rules reproduce all of them (the test above); each alternative misses many.
    // The counts docs/tensor_core.md quotes (787 TDPBF16PS lines, 261 VDPBF16PS lines).
    CHECK(count_matches(capture, "amx_bf16", one_chain_even_first) == 515);
    CHECK(count_matches(capture, "amx_bf16", lanes_one_after_other) == 687);
    CHECK(count_matches(capture, "amx_bf16", accumulator_not_daz) == 759);
    CHECK(count_matches(capture, "avx512_bf16", even_first) == 238);
}

TEST_CASE("amx_bf16: two FMA lanes from +0, then c + (even + odd)", "[tensor_core][amx]")
{
    using namespace tc_amx;
    const float u = std::ldexp(1.0f, -12);  // u * u = 2^-24, half an ulp of 1
    // 2^-24 twice in the even lane makes 2^-23, which 1 keeps; once in each lane as well.
    CHECK(tc::dot<tc::amx_bf16>(std::array{bf(u), bf(0), bf(u), bf(0)}, std::array{bf(u), bf(0), bf(u), bf(0)}, 1.0f) ==
          1.0f + std::ldexp(1.0f, -23));
    CHECK(tc::dot<tc::amx_bf16>(std::array{bf(u), bf(u)}, std::array{bf(u), bf(u)}, 1.0f) == 1.0f + std::ldexp(1.0f, -23));
    // One 2^-24 is a tie: to even.
    CHECK(tc::dot<tc::amx_bf16>(std::array{bf(u), bf(0)}, std::array{bf(u), bf(0)}, 1.0f) == 1.0f);
    // VDPBF16PS adds each product to C on its own: both ties go to even.
    CHECK(tc::dot<tc::avx512_bf16>(std::array{bf(u), bf(u)}, std::array{bf(u), bf(u)}, 1.0f) == 1.0f);
    // A lane's FMA is exact before its rounding: 2^100 - 2^100 + 1 in one lane is 1.
    const float big = std::ldexp(1.0f, 50);
    CHECK(tc::dot<tc::amx_bf16>(std::array{bf(big), bf(0), bf(-big), bf(0), bf(1), bf(0)},
                                std::array{bf(big), bf(0), bf(big), bf(0), bf(1), bf(0)}, 0.0f) == 1.0f);
    // The lanes are summed before C joins: C = 2^24 absorbs neither 1 + 1.
    CHECK(tc::dot<tc::amx_bf16>(std::array{bf(1), bf(1)}, std::array{bf(1), bf(1)}, std::ldexp(1.0f, 24)) ==
          std::ldexp(1.0f, 24) + 2.0f);
    // Shorter tiles: any even K from 2 to 32.
    for (std::size_t k = 2; k <= 32; k += 2) {
        std::vector<bf16> a(k, bf(1)), b(k, bf(2));
        CHECK(tc::dot<tc::amx_bf16>(a, b, 0.5f) == 0.5f + 2.0f * static_cast<float>(k));
    }
    std::vector<bf16> odd(3, bf(1)), long_k(34, bf(1));
    CHECK_THROWS_AS(tc::dot<tc::amx_bf16>(odd, odd, 0.0f), shape_error);
    CHECK_THROWS_AS(tc::dot<tc::amx_bf16>(long_k, long_k, 0.0f), shape_error);
    CHECK_THROWS_AS(tc::dot<tc::avx512_bf16>(std::vector<bf16>(4, bf(1)), std::vector<bf16>(4, bf(1)), 0.0f), shape_error);
}

TEST_CASE("amx_bf16 and avx512_bf16: DAZ, FTZ after rounding, signed zeros, overflow", "[tensor_core][amx]")
{
    using namespace tc_amx;
    const float tiny = std::ldexp(1.0f, -126);
    const bf16 p63 = bf(std::ldexp(1.0f, -63));
    // bf16 subnormal operands read as zero: 2^-130 * 2^100 would be 2^-30.
    const bf16 sub = from_code(0x0008);  // 2^-130
    CHECK(tc::dot<tc::amx_bf16>(std::array{sub, bf(0)}, std::array{bf(std::ldexp(1.0f, 100)), bf(0)}, 1.0f) == 1.0f);
    CHECK(tc::dot<tc::avx512_bf16>(std::array{sub, bf(0)}, std::array{bf(std::ldexp(1.0f, 100)), bf(0)}, 1.0f) == 1.0f);
    // A subnormal C reads as zero.
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{bf(0), bf(0)}, std::array{bf(0), bf(0)}, from_bits(0x807fffffu))) == 0u);
    // Results below 2^-126 after rounding (exponent unbounded) flush to zero; those that round
    // up to 2^-126 stay. 2^-126 - 1.5 * 2^-151 rounds to 2^-126 - 2^-150: flushed. 2^-126 - 2^-152
    // rounds to 2^-126: kept (a flush before rounding would give 0).
    const bf16 m15 = bf(-1.5f * std::ldexp(1.0f, -75));
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{p63, bf(0), m15, bf(0)},
                                        std::array{p63, bf(0), bf(std::ldexp(1.0f, -76)), bf(0)}, 0.0f)) == 0u);
    CHECK(tc::dot<tc::amx_bf16>(std::array{p63, bf(0), bf(-std::ldexp(1.0f, -77)), bf(0)},
                                std::array{p63, bf(0), bf(std::ldexp(1.0f, -75)), bf(0)}, 0.0f) == tiny);
    CHECK(bits_of(tc::dot<tc::avx512_bf16>(std::array{m15, bf(0)}, std::array{bf(std::ldexp(1.0f, -76)), bf(0)}, tiny)) ==
          0u);
    // A product below 2^-126 alone is flushed: 2^-64 * 2^-64.
    const bf16 p64 = bf(std::ldexp(1.0f, -64));
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{p64, bf(0)}, std::array{bf(-std::ldexp(1.0f, -64)), bf(0)}, 0.0f)) == 0u);
    // Signed zeros: the lanes start at +0, so C = -0 with zero products gives +0 on AMX; the
    // VDPBF16PS chain starts from C and keeps -0 + -0 = -0.
    const bf16 mz = from_code(0x8000);
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{mz, mz}, std::array{bf(1), bf(1)}, -0.0f)) == 0u);
    CHECK(bits_of(tc::dot<tc::avx512_bf16>(std::array{mz, mz}, std::array{bf(1), bf(1)}, -0.0f)) == 0x80000000u);
    CHECK(bits_of(tc::dot<tc::avx512_bf16>(std::array{bf(0), bf(0)}, std::array{bf(1), bf(1)}, -0.0f)) == 0u);
    // An exact zero sum is +0.
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{bf(1), bf(0)}, std::array{bf(1), bf(0)}, -1.0f)) == 0u);
    // Overflow: the largest float plus half an ulp is a tie, to even: inf.
    const float largest = std::numeric_limits<float>::max();
    CHECK(tc::dot<tc::amx_bf16>(std::array{bf(std::ldexp(1.0f, 103)), bf(0)}, std::array{bf(1), bf(0)}, largest) ==
          std::numeric_limits<float>::infinity());
    CHECK(tc::dot<tc::amx_bf16>(std::array{bf(std::ldexp(1.0f, 102)), bf(0)}, std::array{bf(1), bf(0)}, largest) == largest);
}

TEST_CASE("amx_bf16 and avx512_bf16: NaN and infinities", "[tensor_core][amx]")
{
    using namespace tc_amx;
    const float inf = std::numeric_limits<float>::infinity();
    const bf16 pinf = bf(inf), ninf = bf(-inf);
    // inf * 0, inf - inf in a lane or across lanes: x86's default NaN 0xffc00000.
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{pinf, bf(0)}, std::array{bf(0), bf(0)}, 0.0f)) == 0xffc00000u);
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{pinf, bf(0), ninf, bf(0)}, std::array{bf(1), bf(0), bf(1), bf(0)}, 0.0f)) ==
          0xffc00000u);
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{pinf, ninf}, std::array{bf(1), bf(1)}, 0.0f)) == 0xffc00000u);
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{pinf, bf(0)}, std::array{bf(1), bf(0)}, -inf)) == 0xffc00000u);
    CHECK(tc::dot<tc::amx_bf16>(std::array{pinf, bf(0)}, std::array{bf(-1), bf(0)}, 1.0f) == -inf);
    // A NaN operand comes out quieted, with its payload: a before b before the accumulator in
    // each FMA, the even lane before the odd one, C before the lanes.
    const bf16 nan_a = from_code(0x7f81), nan_b = from_code(0xffa5);  // signalling NaNs
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{nan_a, bf(0)}, std::array{nan_b, bf(0)}, 0.0f)) == 0x7fc10000u);
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{bf(1), bf(0)}, std::array{nan_b, bf(0)}, 0.0f)) == 0xffe50000u);
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{bf(1), nan_a}, std::array{nan_b, bf(1)}, 0.0f)) == 0xffe50000u);
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{nan_a, bf(0)}, std::array{bf(1), bf(0)}, from_bits(0x7fa00000u))) ==
          0x7fe00000u);
    // C's NaN wins over inf * 0 as well.
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{pinf, bf(0)}, std::array{bf(0), bf(0)}, from_bits(0x7fa00000u))) ==
          0x7fe00000u);
    // Within a chain a later FMA's operands come before the accumulator's NaN: in VDPBF16PS,
    // fma(a[0], b[0], fma(a[1], b[1], c)), product 0's NaN wins over product 1's and C's.
    CHECK(bits_of(tc::dot<tc::avx512_bf16>(std::array{nan_a, bf(1)}, std::array{bf(1), nan_b}, 0.0f)) == 0x7fc10000u);
    CHECK(bits_of(tc::dot<tc::avx512_bf16>(std::array{nan_a, bf(1)}, std::array{bf(1), bf(1)}, from_bits(0xffc12345u))) ==
          0x7fc10000u);
    CHECK(bits_of(tc::dot<tc::avx512_bf16>(std::array{bf(1), nan_a}, std::array{bf(1), bf(1)}, from_bits(0xffc12345u))) ==
          0x7fc10000u);
    CHECK(bits_of(tc::dot<tc::avx512_bf16>(std::array{bf(1), bf(1)}, std::array{bf(1), bf(1)}, from_bits(0xffc12345u))) ==
          0xffc12345u);
    // The same in an AMX lane: pair 1's NaN (a[2]) wins over pair 0's (a[0]) in the even lane.
    CHECK(bits_of(tc::dot<tc::amx_bf16>(std::array{nan_a, bf(0), from_code(0x7f99), bf(0)},
                                        std::array{bf(1), bf(0), bf(1), bf(0)}, 0.0f)) == 0x7fd90000u);
}

TEST_CASE("amx_fp16: fp16 operands widen to their exact float32 values", "[tensor_core][amx]")
{
    using namespace tc_amx;
    // Every one of the 65,536 codes: numbers (subnormals normalised, zeros, infinities) to the
    // float Eigen converts them to; NaNs to sign | 0x7f800000 | payload << 13 (not quieted here).
    for (unsigned code = 0; code <= 0xffffu; ++code) {
        const f16 h = half_code(code);
        const std::uint32_t w = fc::widen(h);
        INFO("code " << code);
        if ((code & 0x7c00u) == 0x7c00u && (code & 0x3ffu) != 0)
            REQUIRE(w == ((code & 0x8000u) << 16 | 0x7f800000u | (code & 0x3ffu) << 13));
        else
            REQUIRE(w == bits_of(static_cast<float>(h)));
        // No fp16 value is a float32 subnormal: DAZ on a widened operand changes nothing.
        REQUIRE(fc::daz(w) == w);
    }
    CHECK(fc::widen(half_code(0x0001)) == bits_of(std::ldexp(1.0f, -24)));  // the least subnormal
    CHECK(fc::widen(half_code(0x83ff)) == bits_of(-1023.0f * std::ldexp(1.0f, -24)));
    CHECK(fc::widen(half_code(0x7bff)) == bits_of(65504.0f));
    CHECK(fc::widen(half_code(0xfc00)) == 0xff800000u);
    CHECK(fc::widen(half_code(0x7e00)) == 0x7fc00000u);
}

TEST_CASE("amx_fp16: the two lanes of TDPBF16PS, fp16 subnormals read exactly", "[tensor_core][amx]")
{
    using namespace tc_amx;
    // fp16 subnormals are products' operands as they are (the SDM: "input FP16 denormals are
    // always handled and not treated as zero"): 2^-24 * 1 = 2^-24 and 2^-24 * 2^-10 = 2^-34, both
    // normal float32 values (amx_bf16 reads a bf16 subnormal as zero). C = 0.
    const f16 least = half_code(0x0001);  // 2^-24
    CHECK(fp16_bits({least, hf(0)}, {hf(1), hf(0)}, 0.0f) == bits_of(std::ldexp(1.0f, -24)));
    CHECK(fp16_bits({least, hf(0)}, {hf(std::ldexp(1.0f, -10)), hf(0)}, 0.0f) == bits_of(std::ldexp(1.0f, -34)));
    // In the odd lane too, and the least product of all: 2^-24 * 2^-24 = 2^-48, exact.
    CHECK(fp16_bits({hf(0), least}, {hf(0), least}, 0.0f) == bits_of(std::ldexp(1.0f, -48)));
    // The largest subnormal squared, 1023^2 * 2^-48 = 1046529 * 2^-48 (20 bits): exact.
    const f16 largest_subnormal = half_code(0x03ff);
    CHECK(fp16_bits({largest_subnormal, hf(0)}, {largest_subnormal, hf(0)}, 0.0f) ==
          bits_of(std::ldexp(1046529.0f, -48)));
    // A product of two 11-bit significands has 22 bits and is exact: (2047/1024)^2 =
    // 4190209 * 2^-20. Plus C = 2^-20 in the join: 4190210 * 2^-20, still exact.
    const f16 all_ones = hf(2047.0f / 1024.0f);
    CHECK(fp16_bits({all_ones, hf(0)}, {all_ones, hf(0)}, std::ldexp(1.0f, -20)) == bits_of(std::ldexp(4190210.0f, -20)));
    // inf * a subnormal is inf, not inf * 0 (which a DAZ would make it).
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(tc::dot<tc::amx_fp16>(std::array{hf(inf), hf(0)}, std::array{least, hf(0)}, 0.0f) == inf);

    // The two lanes from +0, then c + (even + odd); the SDM's literal order (one chain from C,
    // products in increasing k: one_chain_even_first) gives other bits in each of these.
    const f16 u = hf(std::ldexp(1.0f, -12));  // a normal fp16; u * u = 2^-24, half an ulp of 1
    // 2^-24 twice in the even lane makes 2^-23, which 1 keeps: 1 + 2^-23. One chain from C = 1
    // would meet two ties and round both to even: 1.
    const std::vector<f16> uu0{u, hf(0), u, hf(0)};
    CHECK(fp16_bits(uu0, uu0, 1.0f) == bits_of(1.0f + std::ldexp(1.0f, -23)));
    CHECK(one_chain_even_first(widened(uu0), widened(uu0), bits_of(1.0f)) == bits_of(1.0f));
    // Once in each lane: even + odd = 2^-23 before C joins, the same 1 + 2^-23.
    CHECK(fp16_bits({u, u}, {u, u}, 1.0f) == bits_of(1.0f + std::ldexp(1.0f, -23)));
    // A cancellation seen only once the lanes are joined: products 2^24 (a[0] b[0] = 4096^2),
    // -2^24, 1, 0. Even lane: 2^24 + 1 is a tie between 2^24 and 2^24 + 2, to even: 2^24; odd
    // lane: -2^24; even + odd = +0; d = C + 0 = +0. One chain from C = 0: 2^24, 0, then 1.
    const std::vector<f16> a{hf(4096), hf(-4096), hf(1), hf(0)}, b{hf(4096), hf(4096), hf(1), hf(0)};
    CHECK(fp16_bits(a, b, 0.0f) == 0u);
    CHECK(one_chain_even_first(widened(a), widened(b), 0u) == bits_of(1.0f));
    // C joins after the lanes' sum: 1 + 1 = 2 is added to C = 2^24 at once, 2^24 + 2 (one chain
    // from C: 2^24 + 1 twice, ties to even, 2^24).
    const std::vector<f16> ones{hf(1), hf(1)};
    CHECK(fp16_bits(ones, ones, std::ldexp(1.0f, 24)) == bits_of(std::ldexp(1.0f, 24) + 2.0f));
    CHECK(one_chain_even_first(widened(ones), widened(ones), bits_of(std::ldexp(1.0f, 24))) ==
          bits_of(std::ldexp(1.0f, 24)));
    // Any even K from 2 to 32, and nothing else.
    for (std::size_t k = 2; k <= 32; k += 2) {
        std::vector<f16> x(k, hf(1)), y(k, hf(2));
        CHECK(tc::dot<tc::amx_fp16>(x, y, 0.5f) == 0.5f + 2.0f * static_cast<float>(k));
    }
    CHECK_THROWS_AS(tc::dot<tc::amx_fp16>(std::vector<f16>(3, hf(1)), std::vector<f16>(3, hf(1)), 0.0f), shape_error);
    CHECK_THROWS_AS(tc::dot<tc::amx_fp16>(std::vector<f16>(34, hf(1)), std::vector<f16>(34, hf(1)), 0.0f), shape_error);
    CHECK_THROWS_AS(tc::dot<tc::amx_fp16>(std::vector<f16>(4, hf(1)), std::vector<f16>(2, hf(1)), 0.0f), shape_error);
}

TEST_CASE("amx_fp16: the accumulator's DAZ, FTZ, signed zeros, no overflow from finite operands", "[tensor_core][amx]")
{
    using namespace tc_amx;
    // A subnormal C reads as a zero of its sign (taken from TDPBF16PS; the SDM says nothing of
    // the accumulator's denormals). The lanes start at +0, so C = -(2^-126 - 2^-149) with zero
    // products is -0 + +0 = +0. Read as a number instead, C + 0 would be that subnormal, flushed
    // to -0 (the flush keeps the sign): a capture would tell the two apart by this sign bit.
    CHECK(fp16_bits({hf(0), hf(0)}, {hf(1), hf(1)}, from_bits(0x807fffffu)) == 0u);
    CHECK(fp16_bits({hf(0), hf(0)}, {hf(1), hf(1)}, from_bits(0x007fffffu)) == 0u);
    // FTZ (the SDM: "output FP32 denormals are always flushed to zero") cannot fire on fp16
    // products with a normal C: every product is a multiple of 2^-48, so every lane and their sum
    // is 0 or at least 2^-48 in magnitude, and C + sum is C, or at least the ulp of a C near -sum
    // (2^-72 or more). The closest: C = -(2^-48 - 2^-72), the float above -2^-48, plus the least
    // product 2^-48: 2^-72 exactly, a normal float.
    const f16 least = half_code(0x0001);
    CHECK(fp16_bits({least, hf(0)}, {least, hf(0)}, -(std::ldexp(1.0f, -48) - std::ldexp(1.0f, -72))) ==
          bits_of(std::ldexp(1.0f, -72)));
    // C = 2^-126, the least normal, is kept as it is when the products cancel (a +0 sum).
    CHECK(fp16_bits({least, least}, {least, half_code(0x8001)}, std::ldexp(1.0f, -126)) == bits_of(std::ldexp(1.0f, -126)));
    // The flush itself, on the arithmetic amx_bf16 shares (normal inputs): 2^-125 - 1.75 * 2^-126
    // = 2^-128, below 2^-126: +0; the negated sum gives -0, the flushed zero keeping its sign.
    CHECK(fc::add(bits_of(std::ldexp(1.0f, -125)), bits_of(-1.75f * std::ldexp(1.0f, -126))) == 0u);
    CHECK(fc::add(bits_of(-std::ldexp(1.0f, -125)), bits_of(1.75f * std::ldexp(1.0f, -126))) == 0x80000000u);
    // Signed zeros: -0 products and C = -0 give +0 (the lanes start at +0); an exact zero sum is +0.
    const f16 mz = half_code(0x8000);
    CHECK(fp16_bits({mz, mz}, {hf(1), hf(1)}, -0.0f) == 0u);
    CHECK(fp16_bits({hf(1), hf(0)}, {hf(1), hf(0)}, -1.0f) == 0u);
    // The largest product, 65504^2 = 4290774016 = 4190209 * 2^10 (22 bits), once per lane:
    // even + odd = 4190209 * 2^11, exact.
    const std::vector<f16> max2(2, hf(65504.0f));
    CHECK(fp16_bits(max2, max2, 0.0f) == bits_of(std::ldexp(4190209.0f, 11)));
    // No overflow from finite operands: reaching inf needs C + sum >= FLT_MAX + 2^103 (half its
    // ulp), and 32 products sum to less than 2^38 in magnitude. C = FLT_MAX absorbs the largest
    // sum: FLT_MAX; the same negated.
    const std::vector<f16> max32(32, hf(65504.0f)), neg32(32, hf(-65504.0f));
    const float largest = std::numeric_limits<float>::max();
    CHECK(fp16_bits(max32, max32, largest) == bits_of(largest));
    CHECK(fp16_bits(max32, neg32, -largest) == bits_of(-largest));
}

TEST_CASE("amx_fp16: NaN and infinities", "[tensor_core][amx]")
{
    using namespace tc_amx;
    const float inf = std::numeric_limits<float>::infinity();
    const f16 pinf = half_code(0x7c00), ninf = half_code(0xfc00);
    // inf * 0, inf - inf in a lane or across lanes, inf + -inf C: x86's default NaN 0xffc00000.
    CHECK(fp16_bits({pinf, hf(0)}, {hf(0), hf(0)}, 0.0f) == 0xffc00000u);
    CHECK(fp16_bits({pinf, hf(0), ninf, hf(0)}, {hf(1), hf(0), hf(1), hf(0)}, 0.0f) == 0xffc00000u);
    CHECK(fp16_bits({pinf, ninf}, {hf(1), hf(1)}, 0.0f) == 0xffc00000u);
    CHECK(fp16_bits({pinf, hf(0)}, {hf(1), hf(0)}, -inf) == 0xffc00000u);
    CHECK(tc::dot<tc::amx_fp16>(std::array{pinf, hf(0)}, std::array{hf(-1), hf(0)}, 1.0f) == -inf);
    CHECK(tc::dot<tc::amx_fp16>(std::array{hf(1), hf(0)}, std::array{hf(1), hf(0)}, inf) == inf);
    // A NaN operand comes out quieted, payload kept (shifted left 13 by the widening): a before b
    // before the accumulator in each FMA, the even lane before the odd one, C before the lanes.
    // 0x7c01 (signalling, payload 1) widens to 0x7f802000, quieted 0x7fc02000; 0xfd25 (signalling,
    // payload 0x125) to 0xff800000 | 0x125 << 13 = 0xffa4a000, quieted 0xffe4a000.
    const f16 nan_a = half_code(0x7c01), nan_b = half_code(0xfd25);
    CHECK(fp16_bits({nan_a, hf(0)}, {nan_b, hf(0)}, 0.0f) == 0x7fc02000u);
    CHECK(fp16_bits({hf(1), hf(0)}, {nan_b, hf(0)}, 0.0f) == 0xffe4a000u);
    CHECK(fp16_bits({hf(1), nan_a}, {nan_b, hf(1)}, 0.0f) == 0xffe4a000u);  // the even lane's NaN first
    CHECK(fp16_bits({nan_a, hf(0)}, {hf(1), hf(0)}, from_bits(0x7fa00000u)) == 0x7fe00000u);  // C's first
    // C's NaN wins over inf * 0 as well.
    CHECK(fp16_bits({pinf, hf(0)}, {hf(0), hf(0)}, from_bits(0x7fa00000u)) == 0x7fe00000u);
    // A later product's NaN replaces the chain's: pair 1's (a[2] = 0x7c99: 0x7f800000 | 0x99 << 13
    // = 0x7f932000, quieted 0x7fd32000) wins over pair 0's (a[0]) in the even lane.
    CHECK(fp16_bits({nan_a, hf(0), half_code(0x7c99), hf(0)}, {hf(1), hf(0), hf(1), hf(0)}, 0.0f) == 0x7fd32000u);
    // fp16's quiet NaN 0xfe00 widens to float32's, 0xffc00000.
    CHECK(fp16_bits({half_code(0xfe00), hf(0)}, {hf(1), hf(0)}, 0.0f) == 0xffc00000u);
}

TEST_CASE("the chained-FMA arithmetic agrees with the CPU's float FMA in the normal range", "[tensor_core][amx]")
{
    using namespace tc_amx;
    // fc::fma rounds in integers; std::fma (round to nearest, the default environment) is the
    // check wherever its result is a normal float (no DAZ or FTZ can differ there).
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> exponent(-70, 70), sign(0, 1), mantissa(0, 127);
    std::uniform_int_distribution<std::uint32_t> low(0, 0x7fffffu);
    int compared = 0;
    for (int i = 0; i < 20000; ++i) {
        const auto code = [&] {
            return static_cast<std::uint32_t>(sign(rng) << 15 | (exponent(rng) + 127) << 7 | mantissa(rng)) << 16;
        };
        const std::uint32_t a = code(), b = code();
        const std::uint32_t c = static_cast<std::uint32_t>(sign(rng)) << 31 |
                                static_cast<std::uint32_t>(exponent(rng) + 127 + (i % 3) * 10 - 10) << 23 | low(rng);
        const float expect = std::fma(from_bits(a), from_bits(b), from_bits(c));
        if (!std::isnormal(expect)) continue;
        ++compared;
        INFO(a << " " << b << " " << c);
        REQUIRE(fc::fma(a, b, c) == bits_of(expect));
    }
    CHECK(compared > 19000);
}

TEST_CASE("gemm<amx_bf16_gemm> and gemm<avx512_bf16_gemm> chain their instruction along K", "[tensor_core][amx]")
{
    using namespace tc_amx;
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{31}, std::size_t{32}, std::size_t{70}}) {
        const std::size_t m = 3, n = 5;
        xt::xarray<bf16> a = xt::xarray<bf16>::from_shape({m, k}), b = xt::xarray<bf16>::from_shape({k, n});
        for (auto& x : a) x = bf(normal(rng) * 8.0f);
        for (auto& x : b) x = bf(normal(rng));
        const xt::xarray<float> amx = tc::gemm<tc::amx_bf16_gemm>(a, b);
        const xt::xarray<float> avx = tc::gemm<tc::avx512_bf16_gemm>(a, b);
        REQUIRE(amx.shape()[0] == m);
        REQUIRE(amx.shape()[1] == n);
        // The entry point for float32 operands on the bf16 grid (matmul's recipes) gives the same bits.
        std::vector<float> fa(a.begin(), a.end()), fb(b.begin(), b.end()), on_grid(m * n);
        tc::detail::gemm_into_on_grid<tc::amx_bf16_gemm, bf16, bf16>(fa.data(), fb.data(), m, k, n, on_grid.data());
        for (std::size_t i = 0; i < m * n; ++i) CHECK(bits_of(on_grid[i]) == bits_of(amx.data()[i]));
        for (std::size_t i = 0; i < m; ++i) {
            for (std::size_t j = 0; j < n; ++j) {
                const auto row = scalify::testing::row_of(a, i);
                const auto column = scalify::testing::column_of(b, j);
                // Instructions of 32 (AMX) and 2 (AVX512) products, each result the next one's C;
                // an odd K ends with a zero product.
                const float amx_chain = instruction_loop<tc::amx_bf16>(row, column);
                const float avx_chain = instruction_loop<tc::avx512_bf16>(row, column);
                INFO("K = " << k << ", output " << i << ", " << j);
                CHECK(bits_of(amx(i, j)) == bits_of(amx_chain));
                CHECK(bits_of(avx(i, j)) == bits_of(avx_chain));
                CHECK(bits_of(tc::gemm_dot<tc::amx_bf16_gemm>(row, column)) == bits_of(amx_chain));
                CHECK(bits_of(tc::gemm_dot<tc::avx512_bf16_gemm>(row, column)) == bits_of(avx_chain));
            }
        }
    }
    // The float lanes with the CPU's FMA (gemm's fast path) against the integer chain (gemm_dot),
    // on data that reaches every fallback: bf16 codes of all kinds (NaN, inf, subnormals, zeros)
    // and exponents that make results tiny. Also under another rounding mode (the lanes stand
    // aside).
    std::uniform_int_distribution<int> any_code(0, 0xffff), small_exponent(-80, -50), coin(0, 3);
    for (const int mode : {FE_TONEAREST, FE_UPWARD}) {
        for (const std::size_t k : {std::size_t{33}, std::size_t{64}, std::size_t{70}}) {
            const std::size_t m = 4, n = 37;
            const auto operands = drawn_operands<bf16>(m, k, n, [&](bf16& x, int line) {
                const int what = coin(rng);
                if (line % 2 == 0 && what == 0) x = from_code(static_cast<unsigned>(any_code(rng)));
                else if (what == 1) x = bf(std::ldexp(normal(rng), small_exponent(rng)));
                else if (what == 2 && line % 3 == 0) x = bf(0);
                else x = bf(normal(rng));
            });
            const auto& a = operands.first;
            const auto& b = operands.second;
            const auto [amx, avx] = under_rounding(mode, [&] {
                return std::pair<xt::xarray<float>, xt::xarray<float>>{tc::gemm<tc::amx_bf16_gemm>(a, b),
                                                                     tc::gemm<tc::avx512_bf16_gemm>(a, b)};
            });
            for (std::size_t i = 0; i < m; ++i) {
                for (std::size_t j = 0; j < n; ++j) {
                    const auto row = scalify::testing::row_of(a, i);
                    const auto column = scalify::testing::column_of(b, j);
                    INFO("mode " << mode << ", K = " << k << ", output " << i << ", " << j);
                    CHECK(bits_of(amx(i, j)) == bits_of(tc::gemm_dot<tc::amx_bf16_gemm>(row, column)));
                    CHECK(bits_of(avx(i, j)) == bits_of(tc::gemm_dot<tc::avx512_bf16_gemm>(row, column)));
                }
            }
        }
    }
    // K = 0: +0; M or N = 0: empty; shapes that do not multiply: shape_error.
    const xt::xarray<float> zero = tc::gemm<tc::amx_bf16_gemm>(xt::xarray<bf16>::from_shape({2, 0}),
                                                               xt::xarray<bf16>::from_shape({0, 3}));
    REQUIRE(zero.size() == 6);
    for (const float x : zero) CHECK(bits_of(x) == 0u);
    CHECK(tc::gemm<tc::amx_bf16_gemm>(xt::xarray<bf16>::from_shape({0, 4}), xt::xarray<bf16>::from_shape({4, 3})).size() == 0);
    CHECK_THROWS_AS(tc::gemm<tc::amx_bf16_gemm>(xt::xarray<bf16>::from_shape({2, 4}), xt::xarray<bf16>::from_shape({3, 3})),
                    shape_error);
    CHECK_THROWS_AS(tc::gemm_dot<tc::amx_bf16_gemm>(std::vector<bf16>(3), std::vector<bf16>(4)), shape_error);
    // The tags close their concepts, apart from the NVIDIA ones.
    STATIC_REQUIRE(tc::FmaChainModelFor<tc::amx_bf16, bf16, bf16>);
    STATIC_REQUIRE(!tc::FmaChainModelFor<tc::amx_bf16, Eigen::half, Eigen::half>);
    STATIC_REQUIRE(tc::FmaGemmModelFor<tc::avx512_bf16_gemm, bf16, bf16>);
    STATIC_REQUIRE(tc::GemmModel<tc::amx_bf16_gemm>);  // one gemm_model template for every unit
    STATIC_REQUIRE(!tc::InnerProductModel<tc::amx_bf16>);
}

TEST_CASE("gemm<amx_fp16_gemm> chains TDPFP16PS along K, its float lanes equal to the exact chain", "[tensor_core][amx]")
{
    using namespace tc_amx;
    STATIC_REQUIRE(tc::FmaChainModelFor<tc::amx_fp16, f16, f16>);
    STATIC_REQUIRE(!tc::FmaChainModelFor<tc::amx_fp16, bf16, bf16>);
    STATIC_REQUIRE(!tc::FmaChainModelFor<tc::amx_fp16, f16, bf16>);  // no mixed pairs on AMX
    STATIC_REQUIRE(tc::FmaGemmModelFor<tc::amx_fp16_gemm, f16, f16>);
    STATIC_REQUIRE(std::same_as<tc::fma_gemm_model<tc::amx_fp16>, tc::gemm_model<tc::amx_fp16, 0>>);
    STATIC_REQUIRE(tc::amx_fp16::k == 32);
    STATIC_REQUIRE(tc::amx_fp16::order == tc::fma_chain_order::two_lanes_then_accumulator);
    // gemm (the float lanes with the CPU's FMA, the exact chain where they are unsure), gemm_dot
    // (the exact chain) and a loop of dot<amx_fp16> over 32 of K at a time, bit for bit, on fp16
    // codes of every kind: any code (NaN, inf, subnormals), subnormals alone, zeros, large values
    // (products up to 2^32), ordinary ones; K odd, below, at and past 32; under round to nearest
    // and upward (the lanes stand aside).
    std::mt19937 rng(23);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> any_code(0, 0xffff), subnormal(1, 0x3ff), large_exponent(8, 15), coin(0, 5);
    int nan_outputs = 0, number_outputs = 0;
    for (const int mode : {FE_TONEAREST, FE_UPWARD}) {
        for (const std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{31}, std::size_t{32}, std::size_t{33},
                                    std::size_t{64}, std::size_t{70}, std::size_t{101}}) {
            const std::size_t m = 5, n = 37;
            const auto operands = drawn_operands<f16>(m, k, n, [&](f16& x, int line) {
                const int what = coin(rng);
                if (line % 3 == 0 && what == 0) x = half_code(static_cast<unsigned>(any_code(rng)));
                else if (what == 1) x = half_code(static_cast<unsigned>(subnormal(rng) | (coin(rng) % 2) << 15));
                else if (what == 2 && line % 2 == 0) x = hf(0);
                else if (what == 3) x = hf(std::clamp(std::ldexp(normal(rng), large_exponent(rng)), -65504.0f, 65504.0f));
                else x = hf(normal(rng));
            });
            const auto& a = operands.first;
            const auto& b = operands.second;
            const xt::xarray<float> amx = under_rounding(mode, [&] { return xt::xarray<float>(tc::gemm<tc::amx_fp16_gemm>(a, b)); });
            REQUIRE(amx.shape()[0] == m);
            REQUIRE(amx.shape()[1] == n);
            if (mode == FE_TONEAREST) {
                // The entry point for float32 operands on the fp16 grid (matmul's recipes): the same
                // bits, but for NaN payloads (a float NaN converted back to fp16 may lose its own).
                std::vector<float> fa(m * k), fb(k * n), on_grid(m * n);
                std::transform(a.begin(), a.end(), fa.begin(), [](f16 x) { return static_cast<float>(x); });
                std::transform(b.begin(), b.end(), fb.begin(), [](f16 x) { return static_cast<float>(x); });
                tc::detail::gemm_into_on_grid<tc::amx_fp16_gemm, f16, f16>(fa.data(), fb.data(), m, k, n, on_grid.data());
                for (std::size_t i = 0; i < m * n; ++i) {
                    if (std::isnan(amx.data()[i])) CHECK(std::isnan(on_grid[i]));
                    else CHECK(bits_of(on_grid[i]) == bits_of(amx.data()[i]));
                }
            }
            for (std::size_t i = 0; i < m; ++i) {
                for (std::size_t j = 0; j < n; ++j) {
                    const auto row = scalify::testing::row_of(a, i);
                    const auto column = scalify::testing::column_of(b, j);
                    INFO("mode " << mode << ", K = " << k << ", output " << i << ", " << j);
                    const std::uint32_t loop = bits_of(instruction_loop<tc::amx_fp16>(row, column));
                    CHECK(bits_of(amx(i, j)) == loop);
                    CHECK(bits_of(tc::gemm_dot<tc::amx_fp16_gemm>(row, column)) == loop);
                    ++(std::isnan(amx(i, j)) ? nan_outputs : number_outputs);
                }
            }
        }
    }
    // Both kinds of outputs were met (the NaN ones through the lanes' fallback).
    CHECK(nan_outputs > 100);
    CHECK(number_outputs > 1000);
    // K = 0: +0; shapes that do not multiply: shape_error.
    const xt::xarray<float> zero =
        tc::gemm<tc::amx_fp16_gemm>(xt::xarray<f16>::from_shape({2, 0}), xt::xarray<f16>::from_shape({0, 3}));
    REQUIRE(zero.size() == 6);
    for (const float x : zero) CHECK(bits_of(x) == 0u);
    CHECK_THROWS_AS(tc::gemm<tc::amx_fp16_gemm>(xt::xarray<f16>::from_shape({2, 4}), xt::xarray<f16>::from_shape({3, 3})),
                    shape_error);
}
