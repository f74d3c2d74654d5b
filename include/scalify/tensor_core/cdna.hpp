#pragma once
/// \file tensor_core/cdna.hpp
/// AMD's CDNA matrix cores (MFMA instructions of the MI100, MI200 and MI300 series), as the
/// published bit-accurate model MMA-Sim describes them (Xie et al., arXiv 2511.10909;
/// microsoft/MMA-Sim, mmasim/simulator/amd.py and arithmetic.py at commit c785138), checked bit for
/// bit against that model's outputs (tools/gen_cdna_vectors.py, tests/data/cdna/). Two rules, per
/// block of products (an instruction of a longer K chains its blocks, each block's float32 result
/// the next one's accumulator):
///
/// - CDNA1 (MI100) and CDNA2 (MI210, MI250): pairwise float32 additions. Each product is rounded
///   to float32 (fmaf(a, b, +0): exact for f16, rounded for bf16; a zero product is +0), the block's
///   products are summed as a balanced tree of float32 additions (halves: (p0 + p1) + (p2 + p3)),
///   and the tree's sum is added to C. Every operation rounds to nearest even with gradual
///   underflow. CDNA2 flushes: operands, and a C, below their format's smallest normal read as +0,
///   and every product, tree sum and C + sum below 2^-126 becomes a zero of its sign.
///       f16: blocks of 4; bf16: blocks of 2 (v_mfma_f32_*bf16), 4 (CDNA2's v_mfma_f32_*bf16_1k).
/// - CDNA3 (MI300): an exact-sum-then-round unit. The block's products (exact, nominal exponent
///   ea + eb; a zero operand counts with exponent -126, as in MMA-Sim) are cut toward zero to 24
///   bits below their largest exponent e and summed exactly; that sum is rounded down (toward
///   -inf) to 31 bits below max(e, ec), C rounded down to 24 bits below it, the two added exactly
///   and the total rounded once to float32, nearest even (gradual underflow, overflow to inf).
///   fp8 (e4m3fnuz "fp8", e5m2fnuz "bf8", any pair): the even- and odd-indexed products are two
///   such sums, each rounded down to 24 bits below the larger of their exponents before they add,
///   and C takes no part when its exponent lies more than 25 below.
///       f16, bf16: blocks of 8 (one block of 4 for the K = 4 instructions); xf32 (float operands
///       truncated to tf32): blocks of 4; fp8: blocks of 16.
///
/// Non-finite values (MMA-Sim's rules, on no hardware capture here): a NaN operand or C, inf * 0,
/// or +inf and -inf among the products and C give NaN (returned as 0x7fc00000; MMA-Sim's NaN is its
/// host's, so NaN payloads are not modelled); otherwise an infinite product or C gives that
/// infinity. On CDNA3 a finite bf16 or xf32 product of magnitude >= 2^128 gives an infinity of its
/// sign whatever the other terms are (NaN if both signs occur).
///
///     std::array<Eigen::half, 16> a{...}, b{...};
///     float d = tensor_core::dot<tensor_core::mi300_mfma>(a, b, 0.0f);      // v_mfma_f32_16x16x16_f16
///     auto y = tensor_core::gemm<tensor_core::mi300_mfma_chain>(x, w);      // chained along K
///
/// No CDNA GPU was captured for this: the vectors are MMA-Sim's. The second published model,
/// Khattak and Mikaitis's MATLAB MI210MC.m / MI300MC.m (tools/gen_cdna_vectors.m runs them under
/// Octave), agrees except on bf16/xf32 products beyond float32's range and fnuz subnormals; their
/// MI100MC.m rounds each block of CDNA1 once instead of the pairwise tree, a disagreement only a
/// capture can settle (docs/tensor_core.md).
///
/// The units are MatrixInstructions and their GEMMs gemm_model tags (cdna_gemm_model<I> is
/// gemm_model<I, 0>): gemm and gemm_dot are the ones of gemm.hpp, this header supplies their
/// engine (detail::gemm_engine<CdnaModel>); dot takes them through an overload constrained on
/// CdnaModel. The run-time accumulation choice names them (mi100, mi250, mi300). docs: the CDNA
/// section of docs/tensor_core.md.

#include <scalify/detail/parallel.hpp>
#include <scalify/error.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/tensor_core/dot.hpp>
#include <scalify/tensor_core/gemm.hpp>
#include <scalify/tensor_core/model.hpp>

#include <fmt/format.h>
#include <xtensor/xarray.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cfenv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

#if (defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace scalify::tensor_core {

// ---------------------------------------------------------------------------------------------
// Models

/// How a CDNA matrix core sums a block of products and the accumulator.
enum class cdna_sum {
    pairwise_fp32,    ///< CDNA1, CDNA2: products rounded to float32, a balanced tree of float32 adds, then + C
    fused_round_down  ///< CDNA3: exact products cut to 24 bits, summed exactly, rounded down, + C, one RNE
};

/// A CDNA MFMA unit: how it sums (Sum), whether it flushes subnormals (CDNA2) and the block of
/// products of each operand family (0: the unit has no such instruction).
/// \tparam F16Block Eigen::half x Eigen::half
/// \tparam Bf16Block Eigen::bfloat16 x Eigen::bfloat16
/// \tparam Xf32Block float x float, each operand truncated to tf32 (CDNA3's xf32)
/// \tparam Fp8Block float8_e4m3fnuz / float8_e5m2fnuz in any pair (CDNA3's fp8 and bf8)
template <cdna_sum Sum, bool FlushSubnormals, std::size_t F16Block, std::size_t Bf16Block, std::size_t Xf32Block,
          std::size_t Fp8Block>
struct cdna_mfma_model {
    static_assert(Sum == cdna_sum::fused_round_down || (Xf32Block == 0 && Fp8Block == 0),
                  "only the CDNA3 rule (fused_round_down) has xf32 and fp8 instructions");
    static_assert(F16Block <= 16 && Bf16Block <= 16 && Xf32Block <= 16 && Fp8Block <= 16, "blocks of at most 16");
    static constexpr cdna_sum sum = Sum;
    static constexpr bool flush_subnormals = FlushSubnormals;
    static constexpr std::size_t f16_block = F16Block;
    static constexpr std::size_t bf16_block = Bf16Block;
    static constexpr std::size_t xf32_block = Xf32Block;
    static constexpr std::size_t fp8_block = Fp8Block;

    template <class TA, class TB>
    static constexpr std::size_t block_of() noexcept
    {
        constexpr bool fp8a = std::same_as<TA, float8_e4m3fnuz> || std::same_as<TA, float8_e5m2fnuz>;
        constexpr bool fp8b = std::same_as<TB, float8_e4m3fnuz> || std::same_as<TB, float8_e5m2fnuz>;
        if constexpr (fp8a && fp8b) return Fp8Block;
        else if constexpr (!std::same_as<TA, TB>) return 0;
        else if constexpr (std::same_as<TA, Eigen::half>) return F16Block;
        else if constexpr (std::same_as<TA, Eigen::bfloat16>) return Bf16Block;
        else if constexpr (std::same_as<TA, float>) return Xf32Block;
        else return 0;
    }
    /// Products per block for operands TA x TB (0: not taken).
    template <class TA, class TB>
    static constexpr std::size_t block = block_of<TA, TB>();
    template <class TA, class TB>
    static constexpr bool takes = block<TA, TB> != 0;
    /// Products per instruction (per block) for TA x TB, and the largest block.
    template <class TA, class TB>
    static constexpr std::size_t k_for = block<TA, TB>;
    static constexpr std::size_t k = std::max({F16Block, Bf16Block, Xf32Block, Fp8Block});
    using accumulator = float;
    static constexpr std::size_t scale_block = 0;
};

/// A tag describing one CDNA unit: derived from cdna_mfma_model, with a name.
template <class M>
concept CdnaModel = std::is_base_of_v<cdna_mfma_model<M::sum, M::flush_subnormals, M::f16_block, M::bf16_block,
                                                      M::xf32_block, M::fp8_block>,
                                      M> &&
                    requires {
                        { M::name } -> std::convertible_to<const char*>;
                    };

template <class M, class TA, class TB>
concept CdnaModelFor = CdnaModel<M> && M::template takes<TA, TB>;

/// MI100 (CDNA1, gfx908) v_mfma_f32_*f16 (blocks of 4) and v_mfma_f32_*bf16 (blocks of 2):
/// products rounded to float32, pairwise float32 adds, then + C; no flush.
struct mi100_mfma : cdna_mfma_model<cdna_sum::pairwise_fp32, false, 4, 2, 0, 0> {
    static constexpr const char* name = "mi100_mfma";
};

/// MI210, MI250, MI250X (CDNA2, gfx90a) v_mfma_f32_*f16 (blocks of 4) and v_mfma_f32_*bf16_1k
/// (blocks of 4, the bf16 instructions CDNA2 added and compilers emit): CDNA1's pairwise rule with
/// subnormals flushed (operands and C read as +0; every product, sum and result below 2^-126 a
/// zero of its sign).
struct mi250_mfma : cdna_mfma_model<cdna_sum::pairwise_fp32, true, 4, 4, 0, 0> {
    static constexpr const char* name = "mi250_mfma";
};
using mi210_mfma = mi250_mfma;

/// CDNA2's older bf16 instructions, v_mfma_f32_*bf16 without _1k (CDNA1's, blocks of 2), with
/// CDNA2's flush.
struct mi250_mfma_bf16 : cdna_mfma_model<cdna_sum::pairwise_fp32, true, 0, 2, 0, 0> {
    static constexpr const char* name = "mi250_mfma_bf16";
};

/// MI300A, MI300X, MI325X (CDNA3, gfx942) v_mfma_f32_*_f16 / _bf16 (blocks of 8; the K = 4 forms
/// one block of 4), _xf32 (float operands truncated to tf32, blocks of 4) and the fp8 forms
/// _fp8_fp8, _fp8_bf8, _bf8_fp8, _bf8_bf8 (float8_e4m3fnuz, float8_e5m2fnuz; blocks of 16, even
/// and odd products summed apart): the fused round-down rule. CDNA3 has no OCP fp8 (e4m3fn,
/// e5m2) instructions; those came with CDNA4.
struct mi300_mfma : cdna_mfma_model<cdna_sum::fused_round_down, false, 8, 8, 4, 16> {
    static constexpr const char* name = "mi300_mfma";
};
using mi325_mfma = mi300_mfma;

/// A GEMM on a CDNA unit, one chain: gemm_model's (one float32 accumulator per output from +0,
/// blocks of Instruction::block<TA, TB> products along K in increasing k, each block's result the
/// next one's C, as chaining MFMA instructions along K does); a K that is not a multiple of the
/// block ends with a zero-padded block.
template <CdnaModel Instruction>
using cdna_gemm_model = gemm_model<Instruction, 0>;

/// A GEMM model whose instruction is a CDNA unit.
template <class M>
concept CdnaGemmModel = GemmModel<M> && CdnaModel<typename M::instruction>;

template <class M, class TA, class TB>
concept CdnaGemmModelFor = CdnaGemmModel<M> && CdnaModelFor<typename M::instruction, TA, TB>;

/// An f16/bf16 GEMM on the MI100, one chain (the natural order; no library GEMM captured).
struct mi100_mfma_chain : cdna_gemm_model<mi100_mfma> {
    static constexpr const char* name = "mi100_mfma_chain";
};
/// An f16/bf16 (_1k) GEMM on the MI250 (MI210), one chain.
struct mi250_mfma_chain : cdna_gemm_model<mi250_mfma> {
    static constexpr const char* name = "mi250_mfma_chain";
};
/// An f16/bf16/xf32/fp8 GEMM on the MI300, one chain.
struct mi300_mfma_chain : cdna_gemm_model<mi300_mfma> {
    static constexpr const char* name = "mi300_mfma_chain";
};

// ---------------------------------------------------------------------------------------------
// The arithmetic, on float32 bit patterns and decomposed operands

namespace detail::cdna {

inline constexpr std::uint32_t quiet_nan = 0x7fc00000u;
inline constexpr std::uint32_t positive_inf = 0x7f800000u;

[[nodiscard]] constexpr bool is_nan(std::uint32_t x) noexcept { return (x & 0x7fffffffu) > 0x7f800000u; }
[[nodiscard]] constexpr bool is_inf(std::uint32_t x) noexcept { return (x & 0x7fffffffu) == 0x7f800000u; }
[[nodiscard]] constexpr bool is_zero(std::uint32_t x) noexcept { return (x & 0x7fffffffu) == 0; }
[[nodiscard]] constexpr bool negative(std::uint32_t x) noexcept { return (x >> 31) != 0; }

/// The float32 nearest (ties to even) to (-1)^negative * magnitude * 2^lsb, with gradual underflow
/// (the subnormal grid 2^-149) and +-inf from 2^128; magnitude 0 gives a zero of the sign.
[[nodiscard]] constexpr std::uint32_t nearest_float32(std::uint64_t magnitude, int lsb, bool neg) noexcept
{
    const std::uint32_t sign = neg ? 0x80000000u : 0u;
    if (magnitude == 0) return sign;
    const int top = lsb + static_cast<int>(std::bit_width(magnitude)) - 1;
    if (top >= 129) return sign | positive_inf;
    int target = std::max(top - 23, -149);
    std::uint64_t m;
    if (lsb >= target) {
        m = magnitude << (lsb - target);
    } else {
        const int shift = target - lsb;
        if (shift > 64) {
            m = 0;  // below half of the last place
        } else if (shift == 64) {
            m = magnitude > (std::uint64_t{1} << 63) ? 1 : 0;  // a tie rounds to the even 0
        } else {
            const std::uint64_t kept = magnitude >> shift;
            const std::uint64_t rest = magnitude & ((std::uint64_t{1} << shift) - 1);
            const std::uint64_t half = std::uint64_t{1} << (shift - 1);
            m = kept + ((rest > half || (rest == half && (kept & 1) != 0)) ? 1 : 0);
        }
    }
    if (m >> 24) {  // rounded up to 2^24
        m >>= 1;
        ++target;
    }
    if (m < (std::uint64_t{1} << 23)) return sign | static_cast<std::uint32_t>(m);  // subnormal (target = -149)
    const int field = target + 150;
    if (field >= 255) return sign | positive_inf;
    return sign | static_cast<std::uint32_t>(field) << 23 | (static_cast<std::uint32_t>(m) & 0x7fffffu);
}

/// A finite nonzero float32 as significand * 2^lsb.
struct parts {
    std::uint64_t significand;
    int lsb;
};
[[nodiscard]] constexpr parts split(std::uint32_t x) noexcept
{
    const int field = static_cast<int>((x >> 23) & 0xffu);
    const std::uint32_t mantissa = x & 0x7fffffu;
    return field != 0 ? parts{mantissa | 0x800000u, field - 150} : parts{mantissa, -149};
}

/// x + y in float32, rounded to nearest even with gradual underflow (IEEE 754 binary32 addition in
/// round-to-nearest): x + (-x) is +0, -0 + -0 is -0. NaN: quiet_nan.
[[nodiscard]] constexpr std::uint32_t add(std::uint32_t x, std::uint32_t y) noexcept
{
    if (is_nan(x) || is_nan(y)) return quiet_nan;
    if (is_inf(x)) return is_inf(y) && negative(x) != negative(y) ? quiet_nan : x;
    if (is_inf(y)) return y;
    if (is_zero(x)) return is_zero(y) ? (x & y & 0x80000000u) : y;
    if (is_zero(y)) return x;
    const parts a = split(x), b = split(y);
    const int a_top = a.lsb + static_cast<int>(std::bit_width(a.significand)) - 1;
    const int b_top = b.lsb + static_cast<int>(std::bit_width(b.significand)) - 1;
    // A common last place no lower than 60 bits below the larger term's top: a term partly below it
    // keeps a sticky bit, exact enough as the result's last place then lies 35 or more bits above
    // (terms that cancel lie within a bit of each other and are never cut).
    const int lsb = std::max(std::min(a.lsb, b.lsb), std::max(a_top, b_top) - 60);
    const auto aligned = [lsb](const parts& t) -> std::uint64_t {
        if (t.lsb >= lsb) return t.significand << (t.lsb - lsb);
        const int shift = lsb - t.lsb;
        if (shift >= 64) return 1;
        return (t.significand >> shift) | ((t.significand & ((std::uint64_t{1} << shift) - 1)) != 0 ? 1 : 0);
    };
    const std::uint64_t xa = aligned(a), ya = aligned(b);
    if (negative(x) == negative(y)) return nearest_float32(xa + ya, lsb, negative(x));
    if (xa == ya) return 0u;
    return xa > ya ? nearest_float32(xa - ya, lsb, negative(x)) : nearest_float32(ya - xa, lsb, negative(y));
}

/// CDNA2's flush of a result: below 2^-126 in magnitude, a zero of its sign.
[[nodiscard]] constexpr std::uint32_t flush(std::uint32_t x) noexcept
{
    return (x & 0x7f800000u) == 0 ? x & 0x80000000u : x;
}

/// CDNA2's flush of an input (operand or C): below its format's smallest normal, +0.
[[nodiscard]] constexpr operand flush_input(operand x) noexcept
{
    if (x.what == operand::kind::zero || (x.what == operand::kind::finite && x.significand < (1u << (x.exponent - x.lsb))))
        return operand{};
    return x;
}
[[nodiscard]] constexpr std::uint32_t flush_input(std::uint32_t c) noexcept
{
    return (c & 0x7f800000u) == 0 ? 0u : c;
}

/// fmaf(a, b, +0): the product rounded to float32 (nearest even, gradual underflow); a zero
/// product is +0, inf * 0 NaN.
[[nodiscard]] constexpr std::uint32_t product(const operand& a, const operand& b) noexcept
{
    using kind = operand::kind;
    if (a.what == kind::nan || b.what == kind::nan) return quiet_nan;
    const bool neg = a.negative != b.negative;
    if (a.what == kind::infinite || b.what == kind::infinite) {
        if (a.what == kind::zero || b.what == kind::zero) return quiet_nan;
        return (neg ? 0x80000000u : 0u) | positive_inf;
    }
    if (a.what == kind::zero || b.what == kind::zero) return 0u;
    return nearest_float32(std::uint64_t{a.significand} * b.significand, a.lsb + b.lsb, neg);
}

/// The balanced tree of float32 adds over products [lo, hi) (MMA-Sim's pairwise_dot).
template <bool Flush>
[[nodiscard]] constexpr std::uint32_t pairwise(const operand* a, const operand* b, std::size_t lo, std::size_t hi) noexcept
{
    std::uint32_t s;
    if (hi - lo == 1) {
        s = product(a[lo], b[lo]);
    } else {
        const std::size_t mid = lo + (hi - lo) / 2;
        s = add(pairwise<Flush>(a, b, lo, mid), pairwise<Flush>(a, b, mid, hi));
    }
    return Flush ? flush(s) : s;
}

/// One block of the CDNA1/CDNA2 rule: c + tree(products), operands (and c) already flushed where
/// the unit flushes.
template <bool Flush>
[[nodiscard]] constexpr std::uint32_t pairwise_block(const operand* a, const operand* b, std::size_t n,
                                                     std::uint32_t c) noexcept
{
    const std::uint32_t s = add(c, pairwise<Flush>(a, b, 0, n));
    return Flush ? flush(s) : s;
}

/// The float32 accumulator as MMA-Sim's extract_significand_exponent reads it: significand with 23
/// fractional bits (implicit bit included for a normal), exponent (-126 for a subnormal or zero).
struct accumulator_parts {
    std::int64_t significand;  // signed
    int exponent;
};
[[nodiscard]] constexpr accumulator_parts accumulator_of(std::uint32_t c) noexcept
{
    const int field = static_cast<int>((c >> 23) & 0xffu);
    const std::int64_t m = (c & 0x7fffffu) | (field != 0 ? 0x800000u : 0u);
    return {negative(c) ? -m : m, field != 0 ? field - 127 : -126};
}

/// x * 2^shift rounded toward -inf (shift may be negative).
[[nodiscard]] constexpr std::int64_t floor_scale(std::int64_t x, int shift) noexcept
{
    if (shift >= 0) return x << shift;  // callers keep x << shift well inside 63 bits
    if (shift <= -63) return x < 0 ? -1 : 0;
    return x >> (-shift);  // arithmetic: toward -inf
}

/// A product as the CDNA3 unit aligns it: exact significand sa*sb at lsb la+lb, and its nominal
/// exponent ea + eb (a zero operand counts -126).
struct fused_term {
    std::uint64_t significand;
    int lsb;
    int exponent;
    bool negative;
};

/// MMA-Sim's fused_sum with 24 fractional bits: the terms cut toward zero to multiples of
/// 2^(e - 24), e their largest exponent, summed exactly. Returns the sum in units of 2^(e - 24).
[[nodiscard]] constexpr std::int64_t fused_sum(const fused_term* t, std::size_t n, std::size_t stride, int& e) noexcept
{
    int emax = t[0].exponent;
    for (std::size_t i = stride; i < n; i += stride) emax = std::max(emax, t[i].exponent);
    std::int64_t s = 0;
    for (std::size_t i = 0; i < n; i += stride) {
        if (t[i].significand == 0) continue;  // a zero product: its exponent counted, nothing to add
        const int shift = t[i].lsb - (emax - 24);
        std::uint64_t v;
        if (shift >= 0) v = t[i].significand << shift;  // significand < 2^(26 - shift) here
        else v = -shift >= 64 ? 0 : t[i].significand >> -shift;
        s += t[i].negative ? -static_cast<std::int64_t>(v) : static_cast<std::int64_t>(v);
    }
    e = emax;
    return s;
}

/// One block of the CDNA3 rule (MMA-Sim's amd_fused_dot_rd_add with 24 fractional bits, then the
/// float32 conversion): c + sum of n products.
template <bool EvenOdd>
[[nodiscard]] constexpr std::uint32_t fused_block(const operand* a, const operand* b, std::size_t n,
                                                  std::uint32_t c) noexcept
{
    using kind = operand::kind;
    // Non-finite: as the float64 sum of the products and C would be.
    bool pos_inf = false, neg_inf = false, nan = is_nan(c);
    if (is_inf(c)) (negative(c) ? neg_inf : pos_inf) = true;
    for (std::size_t i = 0; i < n; ++i) {
        if (a[i].what == kind::nan || b[i].what == kind::nan) nan = true;
        else if (a[i].what == kind::infinite || b[i].what == kind::infinite) {
            if (a[i].what == kind::zero || b[i].what == kind::zero) nan = true;
            else (a[i].negative != b[i].negative ? neg_inf : pos_inf) = true;
        }
    }
    if (nan || (pos_inf && neg_inf)) return quiet_nan;
    if (pos_inf || neg_inf) return pos_inf ? positive_inf : 0x80000000u | positive_inf;
    // Finite products past float32's range (bf16, xf32) are infinities, whatever else there is.
    fused_term t[16] = {};
    for (std::size_t i = 0; i < n; ++i) {
        const operand& x = a[i];
        const operand& y = b[i];
        const bool zero = x.what == kind::zero || y.what == kind::zero;
        t[i].significand = zero ? 0 : std::uint64_t{x.significand} * y.significand;
        t[i].lsb = x.lsb + y.lsb;
        t[i].exponent = (x.what == kind::zero ? -126 : x.exponent) + (y.what == kind::zero ? -126 : y.exponent);
        t[i].negative = x.negative != y.negative;
        if (!zero && t[i].lsb + static_cast<int>(std::bit_width(t[i].significand)) - 1 >= 128)
            (t[i].negative ? neg_inf : pos_inf) = true;
    }
    if (pos_inf && neg_inf) return quiet_nan;
    if (pos_inf || neg_inf) return pos_inf ? positive_inf : 0x80000000u | positive_inf;

    const accumulator_parts acc = accumulator_of(c);
    std::int64_t s;  // in units of 2^(e - 24)
    int e;
    if constexpr (EvenOdd) {
        int e0 = 0, e1 = 0;
        const std::int64_t s0 = fused_sum(t, n, 2, e0);
        const std::int64_t s1 = n > 1 ? fused_sum(t + 1, n - 1, 2, e1) : 0;
        if (n == 1) e1 = e0;
        e = std::max(e0, e1);
        s = floor_scale(s0, e0 - e) + floor_scale(s1, e1 - e);
    } else {
        s = fused_sum(t, n, 1, e);
    }
    const int max_e = std::max(e, acc.exponent);
    const std::int64_t sum31 = floor_scale(s, 7 + e - max_e);  // units of 2^(max_e - 31)
    std::int64_t c24 = 0;                                      // units of 2^(max_e - 24)
    if (!EvenOdd || acc.exponent >= max_e - 25) c24 = floor_scale(acc.significand, 1 + acc.exponent - max_e);
    const std::int64_t total = sum31 + c24 * 128;
    if (total == 0) return 0u;
    return nearest_float32(static_cast<std::uint64_t>(total < 0 ? -total : total), max_e - 31, total < 0);
}

/// A float operand as CDNA3's xf32 reads it: truncated to tf32 (the low 13 bits dropped, as
/// MMA-Sim's truncate_to_tf32, so a NaN whose payload lies only there reads as inf), with its
/// nominal exponent (-126 for a subnormal).
[[nodiscard]] constexpr operand decompose_xf32(float value) noexcept
{
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(value) & 0xffffe000u;
    return decompose_tf32<tf32_input::truncate>(std::bit_cast<float>(bits));
}

template <class T>
[[nodiscard]] constexpr operand read(const T& x) noexcept
{
    if constexpr (std::same_as<T, float>) return decompose_xf32(x);
    else return decompose(x);
}

/// count operands of type T, stride apart from data + first, read as the unit reads them: an
/// operand_reader, for the reference engine's GEMM body (gemm_reference_with).
template <class T>
void read_operands(const void* data, std::size_t first, std::size_t count, std::size_t stride, operand* out) noexcept
{
    const T* x = static_cast<const T*>(data) + first;
    for (std::size_t i = 0; i < count; ++i) out[i] = read(x[i * stride]);
}

/// One block of Model's rule for n products (1 <= n <= 16); c already read as the unit reads its
/// C (chain() flushes it once, before the first block).
template <CdnaModel Model, bool EvenOdd>
[[nodiscard]] constexpr std::uint32_t block(operand* a, operand* b, std::size_t n, std::uint32_t c) noexcept
{
    if constexpr (Model::sum == cdna_sum::pairwise_fp32) {
        if constexpr (Model::flush_subnormals) {
            for (std::size_t i = 0; i < n; ++i) {
                a[i] = flush_input(a[i]);
                b[i] = flush_input(b[i]);
            }
        }
        return pairwise_block<Model::flush_subnormals>(a, b, n, c);
    } else {
        return fused_block<EvenOdd>(a, b, n, c);
    }
}

template <class TA, class TB>
inline constexpr bool fp8_pair = !std::same_as<TA, float> && !std::same_as<TA, Eigen::half> &&
                                 !std::same_as<TA, Eigen::bfloat16> && !std::same_as<TB, float> &&
                                 !std::same_as<TB, Eigen::half> && !std::same_as<TB, Eigen::bfloat16>;

/// c + sum of n products already read (a and b contiguous), blocks of block_size in increasing k
/// (the last one zero-padded), each block's result the next one's c; a GEMM's promotion every
/// Interval blocks (0: one chain).
template <CdnaModel Model, bool EvenOdd, std::size_t Interval = 0>
[[nodiscard]] std::uint32_t chain_read(const operand* a, const operand* b, std::size_t n, std::size_t block_size,
                                       std::uint32_t c) noexcept
{
    if constexpr (Model::sum == cdna_sum::pairwise_fp32 && Model::flush_subnormals) c = flush_input(c);
    // The accumulator travels as a float's bits (copies keep every NaN payload).
    const auto one = [=](std::size_t s, std::size_t count, float acc) {
        operand x[16], y[16];
        std::copy(a + s, a + s + count, x);
        std::copy(b + s, b + s + count, y);
        std::fill(x + count, x + block_size, operand{});
        std::fill(y + count, y + block_size, operand{});
        return std::bit_cast<float>(block<Model, EvenOdd>(x, y, block_size, std::bit_cast<std::uint32_t>(acc)));
    };
    return std::bit_cast<std::uint32_t>(chain_along_k<Interval>(n, block_size, one, std::bit_cast<float>(c)));
}

/// chain_read over n operands of types TA and TB, read as the unit reads them.
template <CdnaModel Model, class TA, class TB>
[[nodiscard]] std::uint32_t chain(const TA* a, const TB* b, std::size_t n, std::size_t block_size, std::uint32_t c)
{
    std::vector<operand> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i) {
        x[i] = read(a[i]);
        y[i] = read(b[i]);
    }
    return chain_read<Model, fp8_pair<TA, TB>>(x.data(), y.data(), n, block_size, c);
}

inline constexpr std::size_t lane_width = 32;

/// The flush of a float lane's result (CDNA2), on its bits: below 2^-126, a zero of its sign.
[[nodiscard]] inline float flush_lane(float x) noexcept
{
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
    return std::bit_cast<float>(u & ((u & 0x7f800000u) == 0 ? 0x80000000u : 0xffffffffu));
}

/// lane_width outputs of a pairwise unit's GEMM in float lanes (the host's float32 multiply and
/// add, round to nearest even, gradual underflow: the model's operations): a_row holds kp operand
/// values (flushed where the unit flushes; kp a multiple of Block), b_block kp rows of lane_width.
/// A product is a * b + 0 (fmaf(a, b, +0)'s +0 for a zero operand), exact except for bf16 products
/// below 2^-126: the outputs where a product of two nonzero operands fell there are marked in the
/// returned mask (recomputed by chain_read: a product that underflows to -0 keeps its sign there).
template <CdnaModel Model, std::size_t Block, bool CheckTiny>
[[nodiscard]] std::uint32_t pairwise_lanes(const float* a_row, const float* b_block, std::size_t kp, float* out) noexcept
{
    static_assert(Block == 2 || Block == 4, "the pairwise units take blocks of 2 or 4");
    constexpr std::size_t W = lane_width;
    constexpr bool F = Model::flush_subnormals;
    const auto fl = [](float x) { return F ? flush_lane(x) : x; };
    // The flushes inside a block, on its products and its tree's sums, for bf16 only (CheckTiny:
    // the pairwise units take f16 x f16 or bf16 x bf16). f16 operands, flushed from below 2^-14, are
    // multiples of 2^-24: a nonzero product lies from 2^-28 and is a multiple of 2^-48, and so is
    // the exact sum of two of them (nonzero: from 2^-48), whose float (multiple of 2^-71) beside
    // another gives an exact sum that is 0 or from 2^-71: no value there falls below 2^-126, and
    // the flush would leave each as it is. The accumulator's sum keeps its flush.
    const auto fl_block = [](float x) { return F && CheckTiny ? flush_lane(x) : x; };
    alignas(64) float acc[W] = {};
    alignas(64) std::uint32_t bad[W] = {};
    // One loop over the lanes per block, each lane's products and tree in it: the form the
    // compiler vectorises without shuffles (a products array [Block][W] it transposed).
    const auto product = [&](float x, float y, std::uint32_t& tiny) {
        const float raw = x * y;
        if constexpr (CheckTiny) {
            const std::uint32_t r = std::bit_cast<std::uint32_t>(raw);
            tiny |= static_cast<std::uint32_t>((r & 0x7f800000u) == 0) & static_cast<std::uint32_t>(x != 0.0f) &
                    static_cast<std::uint32_t>(y != 0.0f);
        }
        return fl_block(raw + 0.0f);
    };
    for (std::size_t s = 0; s < kp; s += Block) {
        const float* y = b_block + s * W;
        if constexpr (Block == 4) {
            const float x0 = a_row[s], x1 = a_row[s + 1], x2 = a_row[s + 2], x3 = a_row[s + 3];
            for (std::size_t j = 0; j < W; ++j) {
                std::uint32_t tiny = 0;
                const float p0 = product(x0, y[j], tiny), p1 = product(x1, y[W + j], tiny);
                const float p2 = product(x2, y[2 * W + j], tiny), p3 = product(x3, y[3 * W + j], tiny);
                acc[j] = fl(acc[j] + fl_block(fl_block(p0 + p1) + fl_block(p2 + p3)));
                bad[j] |= tiny;
            }
        } else {
            const float x0 = a_row[s], x1 = a_row[s + 1];
            for (std::size_t j = 0; j < W; ++j) {
                std::uint32_t tiny = 0;
                const float p0 = product(x0, y[j], tiny), p1 = product(x1, y[W + j], tiny);
                acc[j] = fl(acc[j] + fl_block(p0 + p1));
                bad[j] |= tiny;
            }
        }
    }
    std::uint32_t mask = 0;
    for (std::size_t j = 0; j < W; ++j) {
        out[j] = std::isnan(acc[j]) ? std::bit_cast<float>(quiet_nan) : acc[j];
        mask |= (bad[j] != 0 ? 1u : 0u) << j;
    }
    return mask;
}

/// An f16, fp8, bf16 or xf32 operand as the float lanes read it: its value (0 for a NaN or inf), its nominal
/// exponent (-126 for a zero) and whether it takes its row or column through the exact chain (not
/// finite; an exponent past 63 is not theirs).
struct float_lane {
    float value;
    std::int16_t exponent;
    bool wild;
};

/// Every code of an 8-bit operand type as float_lane reads it, from lane_table, in three tables
/// (loads the compiler gathers).
template <class T>
struct fp8_lane_tables {
    std::array<float, 256> value{};
    std::array<std::int16_t, 256> exponent{};
    std::array<unsigned char, 256> wild{};
};
template <class T>
inline constexpr fp8_lane_tables<T> fp8_lanes = [] {
    fp8_lane_tables<T> t;
    for (std::size_t code = 0; code < 256; ++code) {
        const lane_operand o = lane_table<T>[code];
        const bool zero = o.exponent == lane_zero_exponent;
        t.wild[code] = o.special || (!zero && o.exponent > 63) ? 1 : 0;
        // A wild code enters the (discarded) lanes as a zero, as float_lane_parts' bf16 and xf32.
        t.value[code] = t.wild[code] != 0 ? 0.0f : o.value;
        t.exponent[code] = static_cast<std::int16_t>(zero || t.wild[code] != 0 ? -126 : int{o.exponent});
    }
    return t;
}();

/// float_lane of an Eigen::half, Eigen::bfloat16, float (xf32) or 8-bit operand, branch-free (f16 on
/// its bits, as lane_decode reads it: the nominal exponent of a subnormal is -14), in parts: the
/// value's bits, the exponent and the wild flag. Integer masks and selects only, the bits read by
/// memcpy, no struct: the forms GCC vectorises (a float select, a bit_cast of the Eigen type, or
/// the struct kept float_lanes_of scalar).
template <class T>
inline void float_lane_parts(const T& x, std::uint32_t& value, std::int16_t& exponent, unsigned& wild) noexcept
{
    if constexpr (std::same_as<T, Eigen::half>) {
        std::uint16_t code;
        std::memcpy(&code, &x, sizeof code);
        const std::uint32_t field = (code >> 10) & 0x1fu, mantissa = code & 0x3ffu;
        const bool special = field == 0x1f;
        value = std::bit_cast<std::uint32_t>(lane_float_of(x)) & (special ? 0u : ~0u);
        // Normal: field - 15; subnormal: -14; zero and non-finite: -126 (bitwise, so that GCC
        // does not turn the choice into a bit test it cannot vectorise).
        const int nominal = static_cast<int>(field) - 15 + static_cast<int>(field == 0);
        const bool none = special | ((field == 0) & (mantissa == 0));
        exponent = static_cast<std::int16_t>(none ? -126 : nominal);
        wild = special ? 1u : 0u;
    } else if constexpr (std::same_as<T, Eigen::bfloat16> || std::same_as<T, float>) {
        // bf16 on its bits, float as xf32 reads it (truncated to tf32): the value is the float of
        // the (truncated) bits. Wild besides the non-finite: exponents past 60 (a block's e must
        // stay <= 120 for join_float_lane) and nonzero operands below 2^-51, subnormals included
        // (every nonzero product then lies from 2^-102, so a block with one has e >= -102 and the
        // scale 2^(24 - e) is a normal float, and every product within 2^27 of the block's top
        // is exact in float: lsb >= e - 26 - 20 >= -149).
        std::uint32_t bits;
        if constexpr (std::same_as<T, float>) {
            std::memcpy(&bits, &x, sizeof bits);
            bits &= 0xffffe000u;
        } else {
            std::uint16_t code;
            std::memcpy(&code, &x, sizeof code);
            bits = std::uint32_t{code} << 16;
        }
        const auto field = static_cast<std::int32_t>((bits >> 23) & 0xffu);
        const bool zero = (bits & 0x7fffffffu) == 0;
        // Bitwise, not ||: GCC turns the short-circuit form into a conditional reduction it
        // cannot vectorise.
        wild = static_cast<unsigned>(!zero) & (static_cast<unsigned>(field > 127 + 60) | static_cast<unsigned>(field < 127 - 51));
        // A wild operand's lanes are discarded (its row or column takes the exact chain), but they
        // are computed: it enters them as a zero, exponent included, so that no block's scale
        // comes from an exponent past the lanes' range (the products' cut to int32 would overflow).
        value = bits & (wild - 1u);
        exponent = static_cast<std::int16_t>((zero | (wild != 0)) ? -126 : field - 127);
    } else {
        static_assert(sizeof(T) == 1, "float lanes: Eigen::half, bf16, float (xf32) and 8-bit operands");
        const unsigned code = code_of(x);
        value = std::bit_cast<std::uint32_t>(fp8_lanes<T>.value[code]);
        exponent = fp8_lanes<T>.exponent[code];
        wild = fp8_lanes<T>.wild[code];
    }
}

template <class T>
[[nodiscard]] inline float_lane float_lane_of(const T& x) noexcept
{
    std::uint32_t value;
    std::int16_t exponent;
    unsigned wild;
    float_lane_parts(x, value, exponent, wild);
    return {std::bit_cast<float>(value), exponent, wild != 0};
}

/// count operands x[0..count) into value and exponent; whether one of them is wild.
template <class T>
[[nodiscard]] inline bool float_lanes_of(const T* x, std::size_t count, float* value, std::int16_t* exponent) noexcept
{
    unsigned wild = 0;
    for (std::size_t i = 0; i < count; ++i) {
        std::uint32_t bits;
        std::int16_t e;
        unsigned w;
        float_lane_parts(x[i], bits, e, w);
        value[i] = std::bit_cast<float>(bits);
        exponent[i] = e;
        wild |= w;
    }
    return wild != 0;
}

/// The join of a block with C in the float lanes (f16, fp8, bf16, xf32), in int32 lanes and one float
/// conversion: fused_block's sum31 + 128 * c24 (units of 2^(max_e - 31), up to 38 bits) rounded
/// once to float32. e is the block's exponent and s its sum (units of 2^(e - 24), |s| < 2^30), cb
/// C's bits, finite with ec = max(exponent, -126) <= 120 (the caller marks the others), and e <= 120;
/// a nonzero s needs e >= -125 (a block with a nonzero f16 or fp8 product has e >= -32). With
/// d = ec - e:
/// - d <= 5 (C at most 5 binades above the block, or below it): z = s + floor(cm * 2^(1 + d)),
///   |z| < 2^31, in units of 2^(e - 24) (s loses nothing; fp8: no C more than 25 below e);
/// - d >= 6: v = 256 cm + floor(s * 2^(7 - d)) in units of 2^(ec - 31), exact in int32 while
///   t = floor(v / 256) lies in [-2^23, 2^23); beyond, the result's last place is 2^(ec - 23) or
///   above and v's round to odd at 2^(ec - 25) (floor(v / 64), the low bit set if v % 64 != 0;
///   |.| > 2^25) rounds to the same float32.
/// float(z) is the one RNE where z is not exact in a float (then s != 0, so e >= -125, or the round
/// to odd, either way a normal result); z * 2^u below is exact (a normal float, |z| >= 1) until
/// the last scaling 2^-31, exact or the one RNE (gradual underflow). A result from 2^96 may reach
/// +-inf in the first product: not finite, it is marked.
template <bool EvenOdd>
[[nodiscard]] inline float join_float_lane(std::int32_t e, std::int32_t s, std::uint32_t cb) noexcept
{
    const auto field = static_cast<std::int32_t>((cb >> 23) & 0xffu);
    const std::int32_t ec = std::max(field, 1) - 127;  // -126 for a subnormal or zero
    const std::uint32_t magnitude = (cb & 0x7fffffu) | (field != 0 ? 0x800000u : 0u);
    const std::uint32_t cm = (cb >> 31) != 0 ? 0u - magnitude : magnitude;  // two's complement, |cm| < 2^24
    const std::int32_t d = ec - e;
    // d <= 5: units of 2^(e - 24).
    std::int32_t cb_part = static_cast<std::int32_t>(cm << 6) >> std::min(static_cast<std::uint32_t>(5 - d), 31u);
    if constexpr (EvenOdd) cb_part &= -static_cast<std::int32_t>(d >= -25);
    const std::int32_t z_low = s + cb_part;
    // d >= 6: units of 2^(ec - 31), or of 2^(ec - 25) rounded to odd.
    const std::int32_t s31 = (s * 2) >> std::min(static_cast<std::uint32_t>(d - 6), 31u);
    const std::uint32_t t = cm + static_cast<std::uint32_t>(s31 >> 8);
    const bool in_int32 = t + 0x800000u < 0x1000000u;
    const std::uint32_t odd = ((cm << 2) + static_cast<std::uint32_t>(s31 >> 6)) | ((s31 & 63) != 0 ? 1u : 0u);
    const std::uint32_t z_high = in_int32 ? (cm << 8) + static_cast<std::uint32_t>(s31) : odd;
    const bool high = d >= 6;
    const auto z = static_cast<std::int32_t>(high ? z_high : static_cast<std::uint32_t>(z_low));
    const std::int32_t unit = high ? ec - (in_int32 ? 31 : 25) : e - 24;  // in [-157, 96]
    const float scale = std::bit_cast<float>(static_cast<std::uint32_t>(unit + 31 + 127) << 23);
    return static_cast<float>(z) * scale * 0x1p-31f;
}

/// lane_width outputs of the CDNA3 unit's GEMM in float and integer lanes: a_val/a_exp hold kp
/// operand values (exact floats) and nominal exponents (int16, -126 for a zero), b_val/b_exp kp
/// rows of lane_width. Each block's products are exact in float and cut with one conversion to
/// int32 (|cut| < 2^26; a block's half sums stay below 2^30); the round-downs are integer shifts;
/// the result's one rounding to float32 (nearest even, gradual underflow, overflow to inf) is
/// join_float_lane's. The operands' products are exact in float and their exponents keep a
/// nonzero product's scale 2^(24 - emax) a normal float (f16, fp8; bf16 and xf32 whose operands
/// are zero or of exponent in [-51, 60], see float_lane_of, so that a block with a nonzero product
/// has e >= -102): the scale is clamped there, where every product is zero. Operands must be
/// finite and every nominal product exponent below 127 (the caller checks); an output whose
/// result is not finite is marked in the returned mask (recomputed by chain_read, which has the
/// rules for infinities and NaN). Every loop runs across the lanes, without branches.
template <std::size_t Block, bool EvenOdd>
[[nodiscard]] std::uint32_t fused_lanes_generic(const float* a_val, const std::int16_t* a_exp, const float* b_val,
                                                const std::int16_t* b_exp, std::size_t kp, float* out) noexcept
{
    constexpr std::size_t W = lane_width;
    constexpr std::size_t halves = EvenOdd ? 2 : 1;
    static_assert(Block % halves == 0);
    alignas(64) float acc[W] = {};
    alignas(64) std::uint32_t lost[W] = {};  // C was not finite at some block
    for (std::size_t s = 0; s < kp; s += Block) {
        const float* av = a_val + s;
        const std::int16_t* ae = a_exp + s;
        const float* bv = b_val + s * W;
        const std::int16_t* be = b_exp + s * W;
        // One loop over the lanes per block, the block's products unrolled in it: the form the
        // compiler vectorises without shuffles.
        for (std::size_t j = 0; j < W; ++j) {
            // The exponents in int16 lanes (sums in [-252, 254]): half the vectors of int32.
            std::int16_t emax16[halves];
            for (std::size_t h = 0; h < halves; ++h) emax16[h] = static_cast<std::int16_t>(ae[h] + be[h * W + j]);
            for (std::size_t q = halves; q < Block; ++q)
                emax16[q % halves] = std::max(emax16[q % halves], static_cast<std::int16_t>(ae[q] + be[q * W + j]));
            std::int32_t emax[halves];
            for (std::size_t h = 0; h < halves; ++h) emax[h] = emax16[h];
            float scale[halves];
            std::int32_t sum[halves];
            for (std::size_t h = 0; h < halves; ++h) {
                // 2^(24 - emax) clamped at 2^127 (emax <= 120 here), the clamp in int16 lanes.
                const std::int16_t clamped = std::max(emax16[h], std::int16_t{-103});
                scale[h] = std::bit_cast<float>(static_cast<std::uint32_t>(151 - clamped) << 23);
                sum[h] = 0;
            }
            for (std::size_t q = 0; q < Block; ++q)
                sum[q % halves] += static_cast<std::int32_t>(av[q] * bv[q * W + j] * scale[q % halves]);  // exact, then cut
            // int32 lanes for the exponents and the right shifts (toward -inf; a shift of 31
            // leaves 0 or -1, as any longer one); the join with C in int32 lanes.
            std::int32_t e = emax[0];
            std::int32_t total_sum = sum[0];  // units of 2^(e - 24), below 2^30
            if constexpr (EvenOdd) {
                e = std::max(emax[0], emax[1]);
                total_sum = (sum[0] >> std::min(e - emax[0], 31)) + (sum[1] >> std::min(e - emax[1], 31));
            }
            const std::uint32_t cb = std::bit_cast<std::uint32_t>(acc[j]);
            acc[j] = join_float_lane<EvenOdd>(e, total_sum, cb);
            // C from 2^121 (or not finite): the join's scale needs max(e, ec) <= 120.
            lost[j] |= static_cast<std::uint32_t>(((cb >> 23) & 0xffu) > 247u);
        }
    }
    std::uint32_t mask = 0;
    for (std::size_t j = 0; j < W; ++j) {
        out[j] = acc[j];
        mask |= (std::isfinite(acc[j]) && lost[j] == 0 ? 0u : 1u) << j;
    }
    return mask;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
/// fused_lanes for blocks of Block products without even/odd halves (xf32: 4; f16, bf16: 8) in
/// AVX-512 vectors of 16 lanes: the bits of fused_lanes_generic (the same operands, products and
/// cuts), with another join of the block's sum s (units of 2^(e - 24); |s| < 2^28 for 4 products,
/// 2^29 for 8) and C. Every result of these lanes is +0 or a multiple of 2^-126 (a nonzero product
/// has e >= -102), so C is never subnormal and never -0. e is clamped at -102 (int16 lanes, 32 a
/// vector, until the scale 2^(24 - e)): below, every product is zero and C loses nothing to a
/// round-down onto 2^(e - 24). With d = ec - e:
/// - d <= 5: z = s + floor(C * 2^(24 - e)) in int32 (|z| < 2^31): the product rounded toward -inf
///   (exact, or below 2^-126 where the floor is the same) and converted toward -inf, by the
///   instructions' own rounding; the result float(z) * 2^(e - 24), the conversion the one
///   rounding (nearest even) and the scaling exact (a normal float, below 2^127 as e <= 120).
/// - d >= 6: the block's sum floored onto C's units 2^(ec - 31), x = floor(2s / 2^(d - 6)) (an
///   arithmetic shift, sign-filled from 32), lies below 2^(ec - 2) (Block 4). Rounded to odd at
///   2^(ec - 26) it is an exact float (|.| <= 2^24), and C + x, of magnitude above 2^(ec - 1), has
///   its last place at 2^(ec - 24) or above, so that one FMA (nearest even, overflow to inf)
///   rounds it as the exact total. Block 8 (|x| < 2^30): x * 2^(ec - 31) + C exact in double (33
///   bits; ec >= -96) and one conversion to float (nearest even, gradual underflow, overflow to
///   inf). (A zero C, read with ec = -127, always takes the first path.)
/// No bound on C is needed (fused_lanes_generic's 2^121), and a result that is not finite stays
/// so (d >= 6 from there on): the outputs not finite at the end are marked. The rounding of the
/// other operations is exact, whatever the environment's; FTZ or DAZ take fused_lanes_generic.
/// (fp8's blocks of 16 in this form ran slower than fused_lanes_generic's.)
template <std::size_t Block>
[[nodiscard]] inline std::uint32_t fused_lanes_avx512(const float* a_val, const std::int16_t* a_exp, const float* b_val,
                                                      const std::int16_t* b_exp, std::size_t kp, float* out) noexcept
{
    constexpr std::size_t W = lane_width;
    static_assert(W == 32, "two vectors of 16 lanes");
    static_assert(Block == 4 || Block == 8, "|s| < 2^29");
    constexpr int toward_negative = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
    constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i exponent_field = _mm512_set1_epi32(0x7f800000);
    const __m512i e_plus_133 = _mm512_set1_epi32(284 << 23);  // minus (151 - e) << 23: (e + 133) << 23
    const __m512i unscale_from = _mm512_set1_epi32(254 << 23);  // minus 2^(24 - e)'s bits: 2^(e - 24)
    const __m512i floor16 = _mm512_set1_epi16(-102);
    const __m512i bias16 = _mm512_set1_epi16(151);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (std::size_t s = 0; s < kp; s += Block) {
        const float* av = a_val + s;
        const std::int16_t* ae = a_exp + s;
        const float* bv = b_val + s * W;
        const std::int16_t* be = b_exp + s * W;
        __m512i e16 = _mm512_add_epi16(_mm512_set1_epi16(ae[0]), _mm512_loadu_si512(be));
        for (std::size_t q = 1; q < Block; ++q)
            e16 = _mm512_max_epi16(e16, _mm512_add_epi16(_mm512_set1_epi16(ae[q]), _mm512_loadu_si512(be + q * W)));
        const __m512i k16 = _mm512_sub_epi16(bias16, _mm512_max_epi16(e16, floor16));  // 151 - e in [31, 253]
        const __m512i k32[2] = {_mm512_cvtepi16_epi32(_mm512_castsi512_si256(k16)),
                                _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(k16, 1))};
        for (std::size_t v = 0; v < 2; ++v) {
            const float* b = bv + 16 * v;
            const __m512i scale_bits = _mm512_slli_epi32(k32[v], 23);  // 2^(24 - e)
            const __m512 scale = _mm512_castsi512_ps(scale_bits);
            const auto cut = [&](std::size_t q) {
                return _mm512_cvttps_epi32(
                    _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(av[q]), _mm512_loadu_ps(b + q * W)), scale));
            };
            // Pairwise (int32 sums are exact in any order).
            __m512i sum = _mm512_add_epi32(_mm512_add_epi32(cut(0), cut(1)), _mm512_add_epi32(cut(2), cut(3)));
            if constexpr (Block == 8)
                sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_add_epi32(cut(4), cut(5)), _mm512_add_epi32(cut(6), cut(7))));
            const __m512 c = acc[v];
            const __m512i field = _mm512_and_si512(_mm512_castps_si512(c), exponent_field);
            const __m512i d6 = _mm512_sub_epi32(field, _mm512_sub_epi32(e_plus_133, scale_bits));  // (d - 6) << 23
            const __mmask16 high = _mm512_cmpge_epi32_mask(d6, _mm512_setzero_si512());
            // d <= 5
            const __m512i c_low =
                _mm512_cvt_roundps_epi32(_mm512_mul_round_ps(c, scale, toward_negative), toward_negative);
            const __m512 z = _mm512_cvt_roundepi32_ps(_mm512_add_epi32(sum, c_low), nearest);
            const __m512 low = _mm512_mul_ps(z, _mm512_castsi512_ps(_mm512_sub_epi32(unscale_from, scale_bits)));
            // d >= 6
            const __m512i x = _mm512_srav_epi32(_mm512_slli_epi32(sum, 1), _mm512_srai_epi32(d6, 23));
            __m512 above;
            if constexpr (Block == 4) {
                const __mmask16 sticky = _mm512_test_epi32_mask(x, _mm512_set1_epi32(31));
                const __m512i odd =
                    _mm512_mask_or_epi32(_mm512_srai_epi32(x, 5), sticky, _mm512_srai_epi32(x, 5), _mm512_set1_epi32(1));
                const __m512 unit = _mm512_mul_ps(_mm512_castsi512_ps(field), _mm512_set1_ps(0x1p-26f));  // 2^(ec - 26)
                above = _mm512_fmadd_round_ps(_mm512_cvtepi32_ps(odd), unit, c, nearest);
            } else {
                const __m512 ec = _mm512_castsi512_ps(field);  // 2^ec
                const auto join_high = [&](__m256i x8, __m256 ec8, __m256 c8) {
                    const __m512d unit = _mm512_mul_pd(_mm512_cvtps_pd(ec8), _mm512_set1_pd(0x1p-31));  // 2^(ec - 31)
                    const __m512d exact = _mm512_fmadd_round_pd(_mm512_cvtepi32_pd(x8), unit, _mm512_cvtps_pd(c8), nearest);
                    return _mm512_cvt_roundpd_ps(exact, nearest);
                };
                const __m256 above_lo =
                    join_high(_mm512_castsi512_si256(x), _mm512_castps512_ps256(ec), _mm512_castps512_ps256(c));
                const __m256 above_hi = join_high(_mm512_extracti64x4_epi64(x, 1),
                                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(ec), 1)),
                                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(c), 1)));
                above = _mm512_castpd_ps(
                    _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(above_lo)), _mm256_castps_pd(above_hi), 1));
            }
            acc[v] = _mm512_mask_blend_ps(high, low, above);
        }
    }
    std::uint32_t mask = 0;
    for (std::size_t v = 0; v < 2; ++v) {
        _mm512_storeu_ps(out + 16 * v, acc[v]);
        const __mmask16 finite = _mm512_cmplt_epi32_mask(
            _mm512_and_si512(_mm512_castps_si512(acc[v]), exponent_field), exponent_field);
        mask |= static_cast<std::uint32_t>(static_cast<std::uint16_t>(~finite)) << (16 * v);
    }
    return mask;
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !(defined(__AVX512F__) && defined(__AVX512BW__))
/// fused_lanes for blocks of Block products (xf32: 4; f16, bf16: 8; fp8: 16, its even and odd
/// products summed apart, EvenOdd) in AVX2 vectors of 8 lanes: the bits of fused_lanes_generic
/// (the same operands, products, cuts and shifts), with fused_lanes_avx512's join (its comment
/// has the argument: every result is +0 or a nonzero multiple of 2^-126, e clamped at -102, and a
/// half's too, where all its products are zero), where AVX2 has no embedded rounding:
/// - d <= 5: floor(C * 2^(24 - e)) from the product rounded to nearest, then floored. The product
///   is exact unless it falls below 2^-126 (C at most 2^-96 beside e up to 120), where the
///   nearest rounding of a positive one floors to 0, as the exact one, and of a negative one
///   gives -0 or a negative subnormal: the floor of a negative C's product is at most -1, a min
///   with -1 for the lanes whose C is negative (C is never -0). EvenOdd: 0 for d < -25 (C is
///   dropped, join_float_lane<true>).
/// - d >= 6: Block 4 as fused_lanes_avx512<4> (x rounded to odd at 2^(ec - 26), exact in float
///   as |x| < 2^29, then one FMA under the environment's nearest rounding). The longer blocks have
///   |s| < 2^30 and |x| < 2^31: x * 2^(ec - 31) + C in double instead (33 bits: exact; ec >= -96)
///   and one conversion to float (nearest even, gradual underflow, overflow to inf).
/// The environment must round to nearest (the engine's check) with neither FTZ nor DAZ (fused_lanes).
template <std::size_t Block, bool EvenOdd>
[[nodiscard]] inline std::uint32_t fused_lanes_avx2(const float* a_val, const std::int16_t* a_exp,
                                                    const float* b_val, const std::int16_t* b_exp, std::size_t kp,
                                                    float* out) noexcept
{
    constexpr std::size_t W = lane_width;
    static_assert(W == 32, "four vectors of 8 lanes");
    constexpr std::size_t halves = EvenOdd ? 2 : 1;
    static_assert(Block == 4 || Block == 8 || (Block == 16 && EvenOdd), "|s| < 2^30");
    const __m256i exponent_field = _mm256_set1_epi32(0x7f800000);
    const __m256i e_plus_133 = _mm256_set1_epi32(284 << 23);  // minus (151 - e) << 23: (e + 133) << 23
    const __m256i unscale_from = _mm256_set1_epi32(254 << 23);  // minus 2^(24 - e)'s bits: 2^(e - 24)
    const __m256i int_max = _mm256_set1_epi32(0x7fffffff);
    const __m256i floor16 = _mm256_set1_epi16(-102);
    const __m256i bias16 = _mm256_set1_epi16(151);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const auto widen = [](__m256i x16, __m256i* x32) {
        x32[0] = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(x16));
        x32[1] = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(x16, 1));
    };
    for (std::size_t s = 0; s < kp; s += Block) {
        const float* av = a_val + s;
        const std::int16_t* ae = a_exp + s;
        const float* bv = b_val + s * W;
        const std::int16_t* be = b_exp + s * W;
        // Per 8 lanes: each half's 151 - e_h (its scale 2^(24 - e_h)), the block's 151 - e and
        // (EvenOdd) each half's shift e - e_h onto the block's units; the exponents in int16 lanes.
        __m256i k_half[halves][4], k_block[4], shift[halves][4];
        for (std::size_t g = 0; g < 2; ++g) {
            const auto exps = [&](std::size_t q) {
                return _mm256_add_epi16(_mm256_set1_epi16(ae[q]),
                                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(be + q * W + 16 * g)));
            };
            __m256i e16[halves];
            for (std::size_t h = 0; h < halves; ++h) e16[h] = exps(h);
            for (std::size_t q = halves; q < Block; ++q) e16[q % halves] = _mm256_max_epi16(e16[q % halves], exps(q));
            for (std::size_t h = 0; h < halves; ++h) {
                e16[h] = _mm256_max_epi16(e16[h], floor16);
                widen(_mm256_sub_epi16(bias16, e16[h]), k_half[h] + 2 * g);  // 151 - e_h in [31, 253]
            }
            if constexpr (EvenOdd) {
                const __m256i e = _mm256_max_epi16(e16[0], e16[1]);
                widen(_mm256_sub_epi16(bias16, e), k_block + 2 * g);
                for (std::size_t h = 0; h < halves; ++h) widen(_mm256_sub_epi16(e, e16[h]), shift[h] + 2 * g);
            } else {
                k_block[2 * g] = k_half[0][2 * g];
                k_block[2 * g + 1] = k_half[0][2 * g + 1];
            }
        }
        for (std::size_t v = 0; v < 4; ++v) {
            const float* b = bv + 8 * v;
            __m256i sum[halves];
            for (std::size_t h = 0; h < halves; ++h) {
                const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(k_half[h][v], 23));  // 2^(24 - e_h)
                const auto cut = [&](std::size_t q) {
                    return _mm256_cvttps_epi32(
                        _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(av[q]), _mm256_loadu_ps(b + q * W)), scale));
                };
                sum[h] = _mm256_add_epi32(cut(h), cut(h + halves));
                for (std::size_t q = h + 2 * halves; q < Block; q += 2 * halves)
                    sum[h] = _mm256_add_epi32(sum[h], _mm256_add_epi32(cut(q), cut(q + halves)));
            }
            __m256i total = sum[0];  // units of 2^(e - 24)
            if constexpr (EvenOdd)
                total = _mm256_add_epi32(_mm256_srav_epi32(sum[0], shift[0][v]),
                                         _mm256_srav_epi32(sum[1], shift[1][v]));
            const __m256i scale_bits = _mm256_slli_epi32(k_block[v], 23);  // 2^(24 - e)
            const __m256 c = acc[v];
            const __m256i cb = _mm256_castps_si256(c);
            const __m256i field = _mm256_and_si256(cb, exponent_field);
            const __m256i d6 = _mm256_sub_epi32(field, _mm256_sub_epi32(e_plus_133, scale_bits));  // (d - 6) << 23
            // d <= 5
            __m256i c_low = _mm256_cvttps_epi32(_mm256_floor_ps(_mm256_mul_ps(c, _mm256_castsi256_ps(scale_bits))));
            c_low = _mm256_min_epi32(c_low, _mm256_or_si256(_mm256_srai_epi32(cb, 31), int_max));
            if constexpr (EvenOdd)
                c_low = _mm256_and_si256(c_low,
                                         _mm256_cmpgt_epi32(d6, _mm256_set1_epi32(-32 * (1 << 23))));  // d >= -25
            const __m256 z = _mm256_cvtepi32_ps(_mm256_add_epi32(total, c_low));
            const __m256 low = _mm256_mul_ps(z, _mm256_castsi256_ps(_mm256_sub_epi32(unscale_from, scale_bits)));
            // d >= 6
            const __m256i x = _mm256_srav_epi32(_mm256_slli_epi32(total, 1), _mm256_srai_epi32(d6, 23));
            __m256 above;
            if constexpr (Block == 4) {
                const __m256i sticky = _mm256_min_epu32(_mm256_and_si256(x, _mm256_set1_epi32(31)), _mm256_set1_epi32(1));
                const __m256i odd = _mm256_or_si256(_mm256_srai_epi32(x, 5), sticky);
                const __m256 unit = _mm256_mul_ps(_mm256_castsi256_ps(field), _mm256_set1_ps(0x1p-26f));  // 2^(ec - 26)
                above = _mm256_fmadd_ps(_mm256_cvtepi32_ps(odd), unit, c);
            } else {
                const __m256 ec = _mm256_castsi256_ps(field);  // 2^ec
                const __m256d to31 = _mm256_set1_pd(0x1p-31);
                const __m256d lo = _mm256_fmadd_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(x)),
                                                   _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(ec)), to31),
                                                   _mm256_cvtps_pd(_mm256_castps256_ps128(c)));
                const __m256d hi = _mm256_fmadd_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(x, 1)),
                                                   _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(ec, 1)), to31),
                                                   _mm256_cvtps_pd(_mm256_extractf128_ps(c, 1)));
                above = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
            }
            acc[v] = _mm256_blendv_ps(above, low, _mm256_castsi256_ps(d6));  // d6's sign: d <= 5
        }
    }
    std::uint32_t mask = 0;
    for (std::size_t v = 0; v < 4; ++v) {
        _mm256_storeu_ps(out + 8 * v, acc[v]);
        const __m256i finite =
            _mm256_cmpgt_epi32(exponent_field, _mm256_and_si256(_mm256_castps_si256(acc[v]), exponent_field));
        mask |= static_cast<std::uint32_t>(~_mm256_movemask_ps(_mm256_castsi256_ps(finite)) & 0xff) << (8 * v);
    }
    return mask;
}
#endif

/// fused_lanes_generic, or a vector form of it (the same bits) where the thread's MXCSR neither
/// flushes results to zero (FTZ: a C * 2^(24 - e) below 2^-126 would read as a zero) nor reads
/// subnormal inputs as zero (DAZ, checked with it): with AVX512F and AVX512BW, xf32's and blocks of
/// 8 (f16, bf16) in AVX-512 (fp8 stays generic: faster there); else with AVX2 and FMA, xf32, blocks
/// of 8 and fp8's blocks of 16 in AVX2.
template <std::size_t Block, bool EvenOdd>
[[nodiscard]] std::uint32_t fused_lanes(const float* a_val, const std::int16_t* a_exp, const float* b_val,
                                        const std::int16_t* b_exp, std::size_t kp, float* out) noexcept
{
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if constexpr ((Block == 4 || Block == 8) && !EvenOdd) {
        constexpr unsigned flush_to_zero = 0x8000u, denormals_are_zero = 0x0040u;
        if ((_mm_getcsr() & (flush_to_zero | denormals_are_zero)) == 0)
            return fused_lanes_avx512<Block>(a_val, a_exp, b_val, b_exp, kp, out);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if constexpr (((Block == 4 || Block == 8) && !EvenOdd) || (Block == 16 && EvenOdd)) {
        constexpr unsigned flush_to_zero = 0x8000u, denormals_are_zero = 0x0040u;
        if ((_mm_getcsr() & (flush_to_zero | denormals_are_zero)) == 0)
            return fused_lanes_avx2<Block, EvenOdd>(a_val, a_exp, b_val, b_exp, kp, out);
    }
#endif
    return fused_lanes_generic<Block, EvenOdd>(a_val, a_exp, b_val, b_exp, kp, out);
}

template <CdnaModel Model, class TA, class TB>
constexpr void check_operands() noexcept
{
    static_assert(Model::template takes<TA, TB>,
                  "this CDNA model does not take these operand types (mi100_mfma, mi250_mfma: Eigen::half x "
                  "Eigen::half, Eigen::bfloat16 x Eigen::bfloat16; mi250_mfma_bf16: bf16 only; mi300_mfma: those, "
                  "float x float (xf32) and float8_e4m3fnuz / float8_e5m2fnuz in any pair)");
}

}  // namespace detail::cdna

// ---------------------------------------------------------------------------------------------
// dot, and the engine of gemm and gemm_dot

/// One instruction's result for one output: c + sum of a[k]*b[k] as Model's unit computes it (bit
/// for bit with MMA-Sim). a and b hold the same number n of products: a multiple of the unit's
/// block for these operands (an instruction's K: v_mfma_f32_16x16x16_f16 is 16), or fewer than a
/// block (one shorter block: the K = 4 f16/bf16 instructions of CDNA3, where the block is 8);
/// shape_error otherwise (and for n = 0 or n > 4096).
template <CdnaModel Model, class TA, class TB>
[[nodiscard]] float dot(std::span<const TA> a, std::span<const TB> b, float c)
{
    detail::cdna::check_operands<Model, TA, TB>();
    constexpr std::size_t block = Model::template block<TA, TB>;
    const std::size_t n = a.size();
    if (b.size() != n || n == 0 || n > 4096 || (n > block && n % block != 0)) {
        SCALIFY_THROW(shape_error(fmt::format("tensor_core::dot<{}>: spans of {} and {} elements; the unit takes the "
                                              "same number of each, a multiple of its block of {} or fewer than "
                                              "a block, at most 4096",
                                              Model::name, a.size(), b.size(), block)));
    }
    return std::bit_cast<float>(
        detail::cdna::chain<Model>(a.data(), b.data(), n, std::min(block, n), std::bit_cast<std::uint32_t>(c)));
}

/// dot over any contiguous ranges (std::array, std::vector, ...).
template <CdnaModel Model, std::ranges::contiguous_range RA, std::ranges::contiguous_range RB>
    requires(!detail::is_const_span<std::remove_cvref_t<RA>> || !detail::is_const_span<std::remove_cvref_t<RB>>)
[[nodiscard]] float dot(const RA& a, const RB& b, float c)
{
    using TA = std::ranges::range_value_t<RA>;
    using TB = std::ranges::range_value_t<RB>;
    return dot<Model, TA, TB>(std::span<const TA>(std::ranges::data(a), std::ranges::size(a)),
                              std::span<const TB>(std::ranges::data(b), std::ranges::size(b)), c);
}

namespace detail {

/// The engine of the CDNA units: float lanes (CDNA1/2) or double and integer lanes (CDNA3) under
/// round to nearest (the default environment), the exact chain for the outputs they leave unsure,
/// under other rounding modes and for promoted chains. Outputs are shared among OpenMP threads
/// when the including program is built with OpenMP.
template <CdnaModel Instruction>
struct gemm_engine<Instruction> {
    template <GemmModel Model, class TA, class TB>
    static void run(const TA* a, const TB* b, std::size_t m, std::size_t k, std::size_t n, float* out)
    {
        constexpr std::size_t block = Instruction::template block<TA, TB>;
        constexpr bool even_odd = cdna::fp8_pair<TA, TB>;
        constexpr std::size_t W = cdna::lane_width;
        // The lanes run one chain; the rounding of their float (or final) operations is the
        // default environment's.
        // Elsewhere the reference engine's GEMM body (compiled once for every model) runs the chain
        // over operands read as the unit reads them.
        const operand_source read_a{a, &cdna::read_operands<TA>}, read_b{b, &cdna::read_operands<TB>};
        if (Model::promotion_interval != 0 || std::fegetround() != FE_TONEAREST) {
            gemm_reference_with(&chain<Model, TA, TB>, read_a, read_b, m, k, n, out);
            return;
        }
        // The outputs the lanes leave unsure: the same chain over their row and column.
        const auto exact = [=](std::size_t i, std::size_t j) {
            std::vector<operand> row(k), column(k);
            read_a(i * k, k, 1, row.data());
            read_b(j, k, n, column.data());
            return chain<Model, TA, TB>(row.data(), column.data(), k);
        };
        const std::size_t kp = (k + block - 1) / block * block, blocks = (n + W - 1) / W;
        // Operands decoded straight into the panels (A by rows, B in blocks of W columns, K
        // padded with zeros), rows of A and blocks of B shared among threads.
        const auto decode = [m, k, n, kp, blocks](auto&& read_a, auto&& read_b) {
            scalify::detail::parallel_for(m, [&](std::size_t i) {
                for (std::size_t p = 0; p < k; ++p) read_a(i, p, i * kp + p);
            });
            constexpr std::size_t width_max = cdna::lane_width;
            scalify::detail::parallel_for(blocks, [&](std::size_t blk) {
                const std::size_t j0 = blk * width_max, width = std::min(width_max, n - j0);
                for (std::size_t p = 0; p < k; ++p)
                    for (std::size_t j = 0; j < width; ++j) read_b(p * n + j0 + j, j0 + j, (blk * kp + p) * width_max + j);
            });
        };
        if constexpr (Instruction::sum == cdna_sum::pairwise_fp32) {
            // Float lanes: f16 and bf16 values are exact floats (NaN and inf included); the unit's
            // flush reads operands below their format's smallest normal as +0.
            const auto value = [](const auto& x) {
                using T = std::remove_cvref_t<decltype(x)>;
                const float v = static_cast<float>(x);
                if constexpr (Instruction::flush_subnormals) {
                    const float smallest = static_cast<float>(std::numeric_limits<T>::min());
                    return std::abs(v) < smallest ? 0.0f : v;
                } else {
                    return v;
                }
            };
            std::vector<float> a_panel(m * kp, 0.0f), b_panel(blocks * kp * W, 0.0f);
            float* const ap = a_panel.data();
            float* const bp = b_panel.data();
            decode([=](std::size_t i, std::size_t p, std::size_t at) { ap[at] = value(a[i * k + p]); },
                   [=](std::size_t from, std::size_t, std::size_t at) { bp[at] = value(b[from]); });
            constexpr bool check_tiny = std::same_as<TA, Eigen::bfloat16>;
            const auto lanes = [=](std::size_t i, std::size_t blk, float* lane_out) {
                return cdna::pairwise_lanes<Instruction, block, check_tiny>(ap + i * kp, bp + blk * kp * W, kp, lane_out);
            };
            lane_tasks<W>(m, n, out, lanes, exact);
        } else {
            // Float and integer lanes (f16, fp8, bf16, xf32). Rows or columns holding a non-finite
            // operand, or one whose exponent could take a block out of the float lanes' range
            // (float_lane_of: bf16 and xf32 subnormals, exponents below -51 or above 60), go
            // through the exact chain.
            std::vector<float> a_val(m * kp, 0.0f), b_val(blocks * kp * W, 0.0f);
            std::vector<std::int16_t> a_exp(m * kp, -126), b_exp(blocks * kp * W, -126);
            std::vector<unsigned char> row_wild(m, 0), column_wild(n, 0);
            float* const av = a_val.data();
            float* const bv = b_val.data();
            std::int16_t* const ae = a_exp.data();
            std::int16_t* const be = b_exp.data();
            unsigned char* const rw = row_wild.data();
            unsigned char* const cw = column_wild.data();
            // Runs of operands decoded branch-free (vectorised), the wild flags
            // gathered locally.
            scalify::detail::parallel_for(m, [=](std::size_t i) {
                rw[i] = cdna::float_lanes_of(a + i * k, k, av + i * kp, ae + i * kp) ? 1 : 0;
            });
            scalify::detail::parallel_for(blocks, [=](std::size_t blk) {
                const std::size_t j0 = blk * W, width = std::min(W, n - j0);
                for (std::size_t p = 0; p < k; ++p) {
                    const TB* from = b + p * n + j0;
                    if (cdna::float_lanes_of(from, width, bv + (blk * kp + p) * W, be + (blk * kp + p) * W)) {
                        for (std::size_t j = 0; j < width; ++j) cw[j0 + j] |= cdna::float_lane_of(from[j]).wild ? 1 : 0;
                    }
                }
            });
            const auto lanes = [=](std::size_t i, std::size_t blk, float* lane_out) {
                if (rw[i]) return ~std::uint32_t{0};
                std::uint32_t unsure =
                    cdna::fused_lanes<block, even_odd>(av + i * kp, ae + i * kp, bv + blk * kp * W, be + blk * kp * W, kp, lane_out);
                const std::size_t j0 = blk * W, width = std::min(W, n - j0);
                for (std::size_t j = 0; j < width; ++j) unsure |= (cw[j0 + j] ? 1u : 0u) << j;
                return unsure;
            };
            lane_tasks<W>(m, n, out, lanes, exact);
        }
    }

    /// An operand as the unit reads it (float: xf32, truncated to tf32).
    template <class T>
    [[nodiscard]] static operand read(const T& x) noexcept
    {
        return cdna::read(x);
    }

    template <GemmModel Model, class TA, class TB>
    [[nodiscard]] static float chain(const operand* x, const operand* y, std::size_t k) noexcept
    {
        return std::bit_cast<float>(cdna::chain_read<Instruction, cdna::fp8_pair<TA, TB>, Model::promotion_interval>(
            x, y, k, Instruction::template block<TA, TB>, 0u));
    }
};

}  // namespace detail

}  // namespace scalify::tensor_core
