#pragma once
/// \file tensor_core/blackwell.hpp
/// The B200's (Blackwell, sm_100) tcgen05.mma units for fp8, fp6 and fp4 operands, as MMA-Sim
/// (Xie et al., arXiv 2511.10909; microsoft/MMA-Sim, mmasim/simulator/arithmetic.py and nv_ptx.py)
/// states them, bit for bit against MMA-Sim's own outputs (tests/data/block_mma/):
///
/// - b200_f8f6f4: kind::f8f6f4, e4m3 / e5m2 / e2m3 / e3m2 / e2m1 in any pair, float32 accumulator.
///   A tag on inner_product_model: K = 32, F = 25, P = 24, every cut toward zero (the H100's rule).
/// - b200_mxf8f6f4: kind::mxf8f6f4, the same operands with one E8M0 scale per 32 elements along
///   K for A and for B. One fused adder: each product joins with exponent ea + eb + esa + esb
///   (nominal operand exponents plus the scales'), K = 32, F = 25, P = 24, cut toward zero.
/// - b200_nvfp4: kind::mxf4nvf4 with UE4M3 scales per 16 (NVFP4), e2m1 x e2m1, K = 64. Two
///   levels: each group of 16 products is summed exactly; the group sum times both scales'
///   significands joins the second adder with the scales' exponents alone (the group sum is not
///   normalised), with the accumulator; F = 35, P = 24, cut toward zero.
/// - b200_mxf4, b200_mxf4_block16: kind::mxf4nvf4 with UE8M0 scales per 32 or per 16 (MXFP4):
///   b200_nvfp4's two-level rule with exponent-only scales.
///
/// MMA-Sim's convention for zeros is kept in the block-scaled models (block_rules<zero_terms::
/// float32_emin>): a zero operand, a zero accumulator and a zero UE4M3 scale bring exponent -126
/// (float32's smallest normal exponent) to the largest-exponent search, and a zero group sum
/// brings its scales' exponents. So the accumulator's exponent is never below -126, and an
/// all-zero A with large scales can cut C away (0 * 2^200 + 1 gives 0). b200_f8f6f4, a template
/// tag, keeps the template's convention (zero products and C = 0 take no part); the two differ only
/// when every product is zero and 0 < |C| < 2^-111 (tests/data/block_mma: one vector).
/// zero_terms::take_no_part gives the block-scaled models the template's convention.
///
/// NaN (0x7fffffff): any NaN operand, accumulator or scale (E8M0 0xff, UE4M3 0x7f/0xff), inf * 0,
/// +inf and -inf together; otherwise an infinite product or C gives that infinity. A UE4M3 scale's
/// sign bit is ignored (MMA-Sim reads it as e4m3fn and takes the magnitude). |result| >= 2^128
/// gives inf; results below 2^-126 are cut toward zero on the 2^-149 grid.
///
///     std::array<float8_e4m3fn, 32> a{...}; std::array<float4_e2m1fn, 32> b{...};
///     float d = dot<b200_mxf8f6f4>(a, b, c, float8_e8m0fnu::from_bits(130), float8_e8m0fnu::from_bits(120));
///     std::array<float4_e2m1fn, 64> x{...}, y{...}; std::array<float8_e4m3fn, 4> sx{...}, sy{...};  // UE4M3
///     float e = dot<b200_nvfp4>(x, y, c, sx, sy);
///     auto z = gemm<b200_mxf8f6f4_chain>(quantize_mx<float8_e4m3fn>(p, 1), quantize_mx<float8_e4m3fn>(q, 0));
///
/// Speed: block_gemm runs each chain in vector lanes (detail::block_lane_chain; 32 outputs at a
/// time, one row of A against a block of B's columns, tasks shared among OpenMP threads): operands
/// and products exact in float, each aligned term cut toward zero by a float-to-int conversion,
/// exact sums in int32/int64, the cut to 24 bits on a double's bits. Outputs whose chain meets a
/// NaN or inf code, a NaN scale, or a result outside float32's normal range (a subnormal or an
/// overflow) run the reference engine (block_inner_product_of) instead: the same bits either way.
///
/// What is not modelled, or not known: MMA-Sim's figures are its authors' measurements on a B200
/// through tcgen05.mma, not a capture shared here; fp6 operands (MMA-Sim's TODO) and fp4 operands in
/// kind::f8f6f4 / mxf8f6f4 follow the same rule by extrapolation; C = inf in kind::mxf4nvf4 (MMA-Sim
/// stops with an error) gives that infinity by decision; the fp16 accumulator of kind::f8f6f4, the
/// .ws and cta_group::2 forms and tcgen05's scale-vector layouts are not modelled. The B200's
/// mma.sync fp8 unit, captured in public, rounds to nearest (b200_qmma, model.hpp): a different
/// rule from b200_f8f6f4's. docs: the Blackwell section of docs/tensor_core.md.

#include <scalify/block/block_scaled_array.hpp>
#include <scalify/detail/parallel.hpp>
#include <scalify/error.hpp>
#include <scalify/tensor_core/dot.hpp>
#include <scalify/tensor_core/gemm.hpp>
#include <scalify/tensor_core/model.hpp>

#include <fmt/format.h>
#include <xtensor/xarray.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

namespace scalify::tensor_core {

// ---------------------------------------------------------------------------------------------
// kind::f8f6f4: a tag on the template

/// The operands of tcgen05.mma kind::f8f6f4 and kind::mxf8f6f4, in any pair.
using f8f6f4_operands = any_pair_of<float8_e4m3fn, float8_e5m2, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn>;

/// B200 `tcgen05.mma.cta_group::1.kind::f8f6f4` with a float32 accumulator, one output: K = 32,
/// F = 25, P = 24, every cut toward zero (MMA-Sim's tcgen05mma: n_accum_fractional_bits 25, "f32").
/// Not b200_qmma: the public capture of the B200's mma.sync m16n8k32 fp8 unit is rounded to
/// nearest, and this rule reproduces 804 and 813 of its 1,250 E4M3 and E5M2 vectors.
struct b200_f8f6f4 : inner_product_model<25, 24, 32, f8f6f4_operands> {
    static constexpr const char* name = "b200_f8f6f4";
};

/// An fp8/fp6/fp4 GEMM on the B200's kind::f8f6f4 unit, one chain over all of K.
struct b200_f8f6f4_chain : gemm_model<b200_f8f6f4, 0> {
    static constexpr const char* name = "b200_f8f6f4_chain";
};

// ---------------------------------------------------------------------------------------------
// Block-scaled models

/// Which exponent a zero brings to the largest-exponent search of a block-scaled unit.
enum class zero_terms {
    float32_emin,  ///< MMA-Sim's: a zero operand, C or UE4M3 scale counts as exponent -126; a zero
                   ///< group sum brings its scales' exponents; C's exponent is at least -126
    take_no_part   ///< the template's: zero products, zero group sums and C = 0 take no part
};

/// The rules of a block-scaled unit besides F, K and the operands.
template <zero_terms Zeros = zero_terms::float32_emin>
struct block_rules {
    static constexpr zero_terms zeros = Zeros;
};

/// How a block-scaled unit adds.
enum class block_adder {
    fused,     ///< one adder: every product joins with its nominal exponent plus its scales' (mxf8f6f4)
    two_level  ///< groups of `group` products summed exactly, each group joining with its scales'
               ///< exponents (mxf4nvf4)
};

/// The scale formats: E8M0 (float8_e8m0fnu: 2^(code - 127), 0xff NaN) and UE4M3 (passed as
/// float8_e4m3fn; the sign bit ignored, 0x7f NaN, subnormals and zero as e4m3's).
enum class scale_format { ue8m0, ue4m3 };

namespace detail {
template <scale_format S>
using scale_type_of = std::conditional_t<S == scale_format::ue8m0, float8_e8m0fnu, float8_e4m3fn>;
}

/// One block-scaled instruction for one output: D = C + sum_k (a[k] * sa[k / B]) * (b[k] * sb[k / B])
/// with B = ScaleBlock, K products, F alignment bits, results cut toward zero to 24 bits.
template <int AlignmentBits, std::size_t K, std::size_t ScaleBlock, class Operands, scale_format Scale, block_adder Adder,
          std::size_t Group = 16, class Rules = block_rules<>>
struct block_scaled_model : instruction_of<Operands, K, float, ScaleBlock> {
    static_assert(AlignmentBits >= 0 && AlignmentBits <= 40, "F (AlignmentBits) must lie in [0, 40]");
    static_assert(K >= 1 && K <= 256 && ScaleBlock >= 1 && K % ScaleBlock == 0, "K must be a multiple of the scale block");
    static_assert(Adder == block_adder::fused || (Group >= 1 && K % Group == 0 && ScaleBlock % Group == 0),
                  "a two-level unit's groups divide its scale blocks");
    static constexpr int alignment_bits = AlignmentBits;
    static constexpr std::size_t scales = K / ScaleBlock;  ///< scales per operand per instruction
    static constexpr scale_format scale = Scale;
    static constexpr block_adder adder = Adder;
    static constexpr std::size_t group = Adder == block_adder::fused ? 1 : Group;  ///< products per first-level sum
    static constexpr std::size_t group_parameter = Group;
    using rules = Rules;
    using scale_type = detail::scale_type_of<Scale>;
};

/// A tag describing a block-scaled instruction: derived from block_scaled_model, with a name.
template <class M>
concept BlockScaledModel =
    std::is_base_of_v<block_scaled_model<M::alignment_bits, M::k, M::scale_block, typename M::operands, M::scale,
                                         M::adder, M::group_parameter, typename M::rules>,
                      M> &&
    requires {
        { M::name } -> std::convertible_to<const char*>;
    };

template <class M, class TA, class TB>
concept BlockScaledModelFor = BlockScaledModel<M> && M::template takes<TA, TB>;

/// B200 `tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X` (float32 accumulator):
/// one E8M0 scale per 32 elements of K for A and for B, K = 32, F = 25, one fused adder
/// (MMA-Sim's tcgen05mma_block_scale with K = 32).
struct b200_mxf8f6f4 : block_scaled_model<25, 32, 32, f8f6f4_operands, scale_format::ue8m0, block_adder::fused> {
    static constexpr const char* name = "b200_mxf8f6f4";
};

/// B200 `tcgen05.mma...kind::mxf4nvf4.block_scale.scale_vec::4X` with UE4M3 scales (NVFP4): e2m1
/// x e2m1, K = 64, one scale per 16 elements, groups of 16 summed exactly, F = 35.
struct b200_nvfp4 : block_scaled_model<35, 64, 16, any_pair_of<float4_e2m1fn>, scale_format::ue4m3, block_adder::two_level> {
    static constexpr const char* name = "b200_nvfp4";
};

/// B200 kind::mxf4nvf4 with UE8M0 scales per 32 (MXFP4, scale_vec::2X): b200_nvfp4's two levels.
struct b200_mxf4 : block_scaled_model<35, 64, 32, any_pair_of<float4_e2m1fn>, scale_format::ue8m0, block_adder::two_level> {
    static constexpr const char* name = "b200_mxf4";
};

/// B200 kind::mxf4nvf4 with UE8M0 scales per 16 (scale_vec::4X with ue8m0).
struct b200_mxf4_block16
    : block_scaled_model<35, 64, 16, any_pair_of<float4_e2m1fn>, scale_format::ue8m0, block_adder::two_level> {
    static constexpr const char* name = "b200_mxf4_block16";
};

/// A GEMM of block-scaled operands, one chain: gemm_model's (Instruction chained along K, each
/// result the next one's C, from C = +0); block_gemm and gemm of BlockScaledArrays run it.
template <BlockScaledModel Instruction>
using block_gemm_model = gemm_model<Instruction, 0>;

/// A GEMM model whose instruction is block-scaled.
template <class M>
concept BlockGemmModel = GemmModel<M> && BlockScaledModel<typename M::instruction>;

/// MXFP8/6/4 GEMM on kind::mxf8f6f4, one chain.
struct b200_mxf8f6f4_chain : block_gemm_model<b200_mxf8f6f4> {
    static constexpr const char* name = "b200_mxf8f6f4_chain";
};
/// NVFP4 GEMM on kind::mxf4nvf4 (UE4M3 per 16), one chain.
struct b200_nvfp4_chain : block_gemm_model<b200_nvfp4> {
    static constexpr const char* name = "b200_nvfp4_chain";
};
/// MXFP4 GEMM on kind::mxf4nvf4 (UE8M0 per 32), one chain.
struct b200_mxf4_chain : block_gemm_model<b200_mxf4> {
    static constexpr const char* name = "b200_mxf4_chain";
};

// ---------------------------------------------------------------------------------------------
// The engine

namespace detail {

/// MMA-Sim's exponent of a zero (extract_significand_exponent: float32's smallest normal exponent).
inline constexpr int mmasim_zero_exponent = -126;

/// A decoded scale: value significand * 2^lsb, exponent its nominal exponent; zero or NaN.
struct scale_value {
    std::uint32_t significand = 1;
    int lsb = 0;
    int exponent = 0;
    bool zero = false;
    bool nan = false;
};

template <scale_format S>
[[nodiscard]] constexpr scale_value decode_scale(unsigned code) noexcept
{
    scale_value s;
    if constexpr (S == scale_format::ue8m0) {
        code &= 0xffu;
        if (code == 0xffu) s.nan = true;
        s.exponent = static_cast<int>(code) - 127;
        s.lsb = s.exponent;
    } else {
        code &= 0x7fu;  // unsigned: the sign bit is ignored
        if (code == 0x7fu) {
            s.nan = true;
            return s;
        }
        const int field = static_cast<int>(code >> 3);
        const unsigned mantissa = code & 7u;
        if (field == 0 && mantissa == 0) {
            s.zero = true;
            s.significand = 0;
            s.exponent = mmasim_zero_exponent;
            s.lsb = s.exponent;
            return s;
        }
        s.significand = field != 0 ? (8u | mantissa) : mantissa;
        s.exponent = (field != 0 ? field : 1) - 7;
        s.lsb = s.exponent - 3;
    }
    return s;
}

template <scale_format S, class T>
[[nodiscard]] constexpr scale_value decode_scale_of(const T& x) noexcept
{
    static_assert(std::same_as<T, scale_type_of<S>>,
                  "block scales: float8_e8m0fnu for the UE8M0 units (b200_mxf8f6f4, b200_mxf4), float8_e4m3fn "
                  "(read as UE4M3) for b200_nvfp4");
    return decode_scale<S>(code_of(x));
}

/// One term of the second adder: value significand * 2^lsb (signed), alignment exponent.
struct block_term {
    std::uint64_t significand;
    int lsb;
    int exponent;
    bool negative;
};

/// C + sum of Model::k scaled products; a(i), b(i) give decomposed operands, sa(j), sb(j) the
/// decoded scales (j < Model::scales).
template <BlockScaledModel Model, class ReadA, class ReadB, class ScaleA, class ScaleB>
[[nodiscard]] float block_inner_product_of(const ReadA& a, const ReadB& b, const ScaleA& sa, const ScaleB& sb, float c) noexcept
{
    constexpr int F = Model::alignment_bits;
    constexpr bool mmasim_zeros = Model::rules::zeros == zero_terms::float32_emin;
    constexpr std::size_t K = Model::k;

    const operand acc = decompose(c);
    bool nan = acc.what == operand::kind::nan;
    bool plus_inf = acc.what == operand::kind::infinite && !acc.negative;
    bool minus_inf = acc.what == operand::kind::infinite && acc.negative;

    scale_value scale_a[Model::scales], scale_b[Model::scales];
    for (std::size_t j = 0; j < Model::scales; ++j) {
        scale_a[j] = sa(j);
        scale_b[j] = sb(j);
        nan = nan || scale_a[j].nan || scale_b[j].nan;
    }

    block_term terms[K + 1];
    std::size_t count = 0;
    int emax = std::numeric_limits<int>::min();
    const auto join = [&](const block_term& t) {
        emax = std::max(emax, t.exponent);
        terms[count++] = t;
    };

    if constexpr (Model::adder == block_adder::fused) {
        for (std::size_t i = 0; i < K; ++i) {
            const operand x = a(i), y = b(i);
            if (x.what == operand::kind::nan || y.what == operand::kind::nan) {
                nan = true;
                continue;
            }
            const bool zero = x.what == operand::kind::zero || y.what == operand::kind::zero;
            if (x.what == operand::kind::infinite || y.what == operand::kind::infinite) {
                if (zero) nan = true;
                else if (x.negative != y.negative) minus_inf = true;
                else plus_inf = true;
                continue;
            }
            const scale_value& s = scale_a[i / Model::scale_block];
            const scale_value& t = scale_b[i / Model::scale_block];
            const int scale_exponent = s.exponent + t.exponent;  // E8M0: significands are 1
            if (zero) {
                if constexpr (mmasim_zeros) {
                    const int ex = x.what == operand::kind::zero ? mmasim_zero_exponent : x.exponent;
                    const int ey = y.what == operand::kind::zero ? mmasim_zero_exponent : y.exponent;
                    join(block_term{0, 0, ex + ey + scale_exponent, false});
                }
                continue;
            }
            join(block_term{std::uint64_t{x.significand} * y.significand * s.significand * t.significand,
                            x.lsb + y.lsb + s.lsb + t.lsb, x.exponent + y.exponent + scale_exponent,
                            x.negative != y.negative});
        }
    } else {
        // Level one: each group of Model::group products summed exactly, in units of the
        // operands' smallest last place (2^(la_min + lb_min)).
        for (std::size_t g = 0; g < K / Model::group; ++g) {
            std::int64_t sum = 0;
            int unit = std::numeric_limits<int>::max();
            operand xs[Model::group], ys[Model::group];
            for (std::size_t i = 0; i < Model::group; ++i) {
                xs[i] = a(g * Model::group + i);
                ys[i] = b(g * Model::group + i);
                if (xs[i].what == operand::kind::nan || ys[i].what == operand::kind::nan) nan = true;
                const bool zero = xs[i].what == operand::kind::zero || ys[i].what == operand::kind::zero;
                if (xs[i].what == operand::kind::infinite || ys[i].what == operand::kind::infinite) {
                    if (zero) nan = true;
                    else if (xs[i].negative != ys[i].negative) minus_inf = true;
                    else plus_inf = true;
                }
                if (xs[i].what == operand::kind::finite && ys[i].what == operand::kind::finite) {
                    unit = std::min(unit, xs[i].lsb + ys[i].lsb);
                }
            }
            for (std::size_t i = 0; i < Model::group; ++i) {
                if (xs[i].what != operand::kind::finite || ys[i].what != operand::kind::finite) continue;
                const auto p = static_cast<std::int64_t>(std::uint64_t{xs[i].significand} * ys[i].significand
                                                         << (xs[i].lsb + ys[i].lsb - unit));
                sum += xs[i].negative != ys[i].negative ? -p : p;
            }
            const scale_value& s = scale_a[g * Model::group / Model::scale_block];
            const scale_value& t = scale_b[g * Model::group / Model::scale_block];
            const std::uint64_t magnitude = sum < 0 ? 0 - static_cast<std::uint64_t>(sum) : static_cast<std::uint64_t>(sum);
            const std::uint64_t significand = magnitude * s.significand * t.significand;
            if (significand == 0) {
                if constexpr (mmasim_zeros) join(block_term{0, 0, s.exponent + t.exponent, false});
                continue;
            }
            // Level two: the group sum is not normalised; it joins with the scales' exponents.
            join(block_term{significand, unit + s.lsb + t.lsb, s.exponent + t.exponent, sum < 0});
        }
    }
    if (nan || (plus_inf && minus_inf)) return canonical_nan();
    if (plus_inf || minus_inf) return infinity_of<float>(minus_inf);

    if (acc.what == operand::kind::finite) {
        join(block_term{acc.significand, acc.lsb, mmasim_zeros ? std::max(acc.exponent, mmasim_zero_exponent) : acc.exponent,
                        acc.negative});
    } else if constexpr (mmasim_zeros) {
        join(block_term{0, 0, mmasim_zero_exponent, false});
    }
    if (count == 0) return 0.0f;

    // Align to units of 2^(emax - F), each term cut toward zero on its own, one exact sum.
    const int unit = emax - F;
    std::int64_t sum = 0;
    for (std::size_t i = 0; i < count; ++i) {
        if (terms[i].significand == 0) continue;
        const int shift = terms[i].lsb - unit;
        const std::uint64_t aligned = shift >= 0 ? terms[i].significand << shift
                                                 : shift_right<rounding_mode::toward_zero>(terms[i].significand, -shift);
        sum += terms[i].negative ? -static_cast<std::int64_t>(aligned) : static_cast<std::int64_t>(aligned);
    }
    if (sum == 0) return 0.0f;
    const bool negative = sum < 0;
    std::uint64_t magnitude = negative ? 0 - static_cast<std::uint64_t>(sum) : static_cast<std::uint64_t>(sum);
    int exponent = unit;
    const int excess = std::bit_width(magnitude) - 24;
    if (excess > 0) {
        magnitude >>= excess;
        exponent += excess;
    }
    return to_float32<rounding_mode::toward_zero>(magnitude, exponent, negative);
}

// ---- block-scaled GEMMs in lanes ---------------------------------------------------------------

/// Exponent a zero operand brings to the lanes' largest-exponent search: MMA-Sim's -126, or one
/// below every real exponent (take_no_part).
template <BlockScaledModel I>
inline constexpr int block_zero_exponent = I::rules::zeros == zero_terms::float32_emin ? mmasim_zero_exponent : -4096;

/// Bits of one aligned term of a fused block-scaled unit: below 2^(F + 2) times the scales'
/// significands (each below 2).
template <BlockScaledModel I>
inline constexpr int block_term_bits = I::alignment_bits + 2 + (I::scale == scale_format::ue4m3 ? 2 : 0);

/// Whether I's block-scaled GEMM over TA x TB runs in lanes (block_lane_chain) and computes exactly
/// what block_inner_product_of does. Operands are floats (exact); the fused adder's products times
/// both scales' significands are exact in float, and each aligned term trunc(p * 2^(S + F - emax))
/// (S the scales' exponents) lies below 2^30; the two-level adder's group sums are exact in float,
/// and so are they times both scales' significands; every chain's exact sum holds in a double.
template <BlockScaledModel I, class TA, class TB>
struct block_lane_fit {
    using fa = lane_format<typename I::operands, TA>;
    using fb = lane_format<typename I::operands, TB>;
    static constexpr int F = I::alignment_bits;
    /// Significant bits of a decoded scale's significand (UE4M3 4, E8M0 1), and the bits a
    /// product of two gains above 2^(exponents).
    static constexpr int scale_bits = I::scale == scale_format::ue4m3 ? 4 : 1;
    static constexpr int scale_growth = scale_bits > 1 ? 2 : 0;
    static constexpr bool operands_fit_float =
        fa::mantissa_bits + fb::mantissa_bits + 2 <= 24 && fa::smallest_exponent >= -126 &&
        fb::smallest_exponent >= -126 && fa::smallest_exponent - fa::mantissa_bits >= -149 &&
        fb::smallest_exponent - fb::mantissa_bits >= -149 &&
        fa::largest_exponent + fb::largest_exponent + 2 + scale_growth <= 126;
    /// Fused: a term, below 2^(F + 2) times the scales' significands, in int32 lanes; the scale
    /// factor 2^(S + F - emax) at most 2^120 wherever a product is nonzero.
    static constexpr int term_bits = block_term_bits<I>;
    static constexpr bool fused_fits = fa::mantissa_bits + fb::mantissa_bits + 2 + 2 * scale_bits <= 24 && term_bits <= 30 &&
                                       term_bits + static_cast<int>(std::bit_width(I::k + 1)) <= 53 &&
                                       F - fa::smallest_exponent - fb::smallest_exponent <= 120;
    /// Two-level: a group's sum spans its products' bits and log2(group) more.
    static constexpr int group_span = fa::largest_exponent + fb::largest_exponent + 2 -
                                      (fa::smallest_exponent - fa::mantissa_bits + fb::smallest_exponent - fb::mantissa_bits) +
                                      static_cast<int>(std::bit_width(I::group));
    static constexpr int group_term_bits =
        F + fa::largest_exponent + fb::largest_exponent + 2 + static_cast<int>(std::bit_width(I::group)) + scale_growth;
    static constexpr bool two_level_fits =
        group_span + 2 * scale_bits <= 24 &&
        std::max(group_term_bits, F + 1) + static_cast<int>(std::bit_width(I::k / I::group + 1)) <= 53;
    static constexpr bool usable = operands_fit_float && (I::adder == block_adder::fused ? fused_fits : two_level_fits);
};

/// The decoded operands and scales of a block-scaled GEMM, K padded to whole instructions (zero
/// operands, the last block's scales, as block_gemm pads): A by rows, B in blocks of lane_width
/// columns (K rows of them); scales as exponent and significand (value / 2^exponent, exact).
struct block_panels {
    const float* a_val;
    const std::int16_t* a_exp;  ///< nominal exponents, block_zero_exponent for a zero
    const float* b_val;
    const std::int16_t* b_exp;
    const std::int32_t* sa_exp;
    const float* sa_sig;
    const std::int32_t* sb_exp;
    const float* sb_sig;
    std::size_t k;       ///< padded K
    std::size_t blocks;  ///< scale blocks along the padded K
};

/// 2^e as a float, e clamped to the normal exponents.
[[nodiscard]] inline float block_pow2(std::int32_t e) noexcept
{
    e = std::min(std::max(e, -126), 127);
    return std::bit_cast<float>(static_cast<std::uint32_t>(127 + e) << 23);
}

/// Rows of A taken together by one lane task of block_gemm_into: each block of B is read from L1
/// once per instruction for all of them.
inline constexpr std::size_t block_task_rows = 4;

/// Rows [i0, i0 + rows) of A (rows <= block_task_rows) against one block of lane_width columns: I's
/// whole chain along K, lane by lane, into lane_out (rows x lane_width). masks[r] gets the lanes of
/// row i0 + r whose result left float32's normal range at some step (a subnormal or infinite
/// result, which the reference engine gives instead).
template <BlockScaledModel I>
void block_lane_chain(const block_panels& p, std::size_t i0, std::size_t rows, std::size_t block, float* lane_out,
                      std::uint32_t* masks)
{
    constexpr std::size_t W = lane_width, K = I::k, B = I::scale_block, R = block_task_rows;
    constexpr int F = I::alignment_bits;
    constexpr bool mmasim = I::rules::zeros == zero_terms::float32_emin;
    constexpr std::int32_t none = -(1 << 20);  // below every exponent that joins
    const std::size_t kp = p.k;
    const float* bv = p.b_val + block * kp * W;
    const std::int16_t* be = p.b_exp + block * kp * W;
    const std::int32_t* sbe = p.sb_exp + block * p.blocks * W;
    const float* sbs = p.sb_sig + block * p.blocks * W;

    alignas(64) std::array<std::array<float, W>, R> accumulators{};
    alignas(64) std::array<std::array<std::int32_t, W>, R> unsures{};
    alignas(64) std::array<std::int32_t, W> emax{};
    alignas(64) std::array<lane_exact_sum, W> sum{};
    for (std::size_t s = 0; s < kp; s += K) {
        for (std::size_t r = 0; r < rows; ++r) {
            const std::size_t i = i0 + r;
            const float* av = p.a_val + i * kp;
            const std::int16_t* ae = p.a_exp + i * kp;
            const std::int32_t* sae = p.sa_exp + i * p.blocks;
            const float* sas = p.sa_sig + i * p.blocks;
            std::array<float, W>& c = accumulators[r];
            std::array<std::int32_t, W>& unsure = unsures[r];
            // C: zero, or a normal float (lanes that left the range are unsure and run from C = 0).
            for (std::size_t j = 0; j < W; ++j) {
                const auto bits = std::bit_cast<std::uint32_t>(c[j]);
                const auto field = static_cast<std::int32_t>((bits >> 23) & 0xffu);
                const std::int32_t zero = mmasim ? mmasim_zero_exponent : none;
                emax[j] = (bits & 0x7fffffffu) == 0 ? zero : std::max(field - 127, mmasim_zero_exponent);
            }
            if constexpr (I::adder == block_adder::fused) {
                constexpr std::size_t Q = K / B;
                constexpr std::size_t run = static_cast<std::size_t>(std::uint64_t{INT32_MAX} /
                                                                     ((std::uint64_t{1} << block_term_bits<I>) - 1));
                static_assert(run >= 1);
                alignas(64) std::array<std::array<std::int32_t, W>, Q> scale_exp{};
                for (std::size_t q = 0; q < Q; ++q) {
                    const std::size_t t0 = s + q * B, blk = t0 / B;
                    // In int16 lanes (twice as many per vector): the sums of two exponents fit.
                    alignas(64) std::array<std::int16_t, W> top{};
                    for (std::size_t j = 0; j < W; ++j) top[j] = static_cast<std::int16_t>(ae[t0] + be[t0 * W + j]);
                    for (std::size_t t = t0 + 1; t < t0 + B; ++t) {
                        const std::int16_t a = ae[t];
                        const std::int16_t* b = be + t * W;
                        for (std::size_t j = 0; j < W; ++j) top[j] = std::max(top[j], static_cast<std::int16_t>(a + b[j]));
                    }
                    for (std::size_t j = 0; j < W; ++j) {
                        scale_exp[q][j] = sae[blk] + sbe[blk * W + j];
                        emax[j] = std::max(emax[j], top[j] + scale_exp[q][j]);
                    }
                }
                for (std::size_t q = 0; q < Q; ++q) {
                    const std::size_t t0 = s + q * B, blk = t0 / B;
                    // Units of 2^(emax - F): each product times both significands and 2^(S + F - emax),
                    // exact where the term is 1 or more (block_lane_fit), below 1 otherwise.
                    alignas(64) std::array<float, W> factor{};
                    for (std::size_t j = 0; j < W; ++j) {
                        const std::int32_t e = std::clamp(scale_exp[q][j] + F - emax[j], -126, 120);
                        factor[j] = std::bit_cast<float>(static_cast<std::uint32_t>(127 + e) << 23) * sas[blk] * sbs[blk * W + j];
                    }
                    for (std::size_t u = t0; u < t0 + B; u += run) {
                        const std::size_t stop = std::min(u + run, t0 + B);
                        alignas(64) std::array<std::int32_t, W> part{};
                        for (std::size_t j = 0; j < W; ++j) part[j] = static_cast<std::int32_t>(av[u] * bv[u * W + j] * factor[j]);
                        for (std::size_t t = u + 1; t < stop; ++t) {
                            const float a = av[t];
                            const float* b = bv + t * W;
                            for (std::size_t j = 0; j < W; ++j) part[j] += static_cast<std::int32_t>(a * b[j] * factor[j]);
                        }
                        if (u == s) {
                            for (std::size_t j = 0; j < W; ++j) sum[j] = static_cast<lane_exact_sum>(part[j]);
                        } else {
                            for (std::size_t j = 0; j < W; ++j) sum[j] += static_cast<lane_exact_sum>(part[j]);
                        }
                    }
                }
            } else {
                // Level one: each group's sum, exact in float, times both scales' significands (exact);
                // it joins the second adder with the scales' exponents (a zero sum too, under MMA-Sim's
                // convention).
                constexpr std::size_t G = K / I::group;
                alignas(64) std::array<std::array<float, W>, G> term{};
                alignas(64) std::array<std::array<std::int32_t, W>, G> scale_exp{};
                for (std::size_t g = 0; g < G; ++g) {
                    const std::size_t t0 = s + g * I::group, blk = t0 / B;
                    alignas(64) std::array<float, W> group_sum{};
                    for (std::size_t j = 0; j < W; ++j) group_sum[j] = av[t0] * bv[t0 * W + j];
                    for (std::size_t t = t0 + 1; t < t0 + I::group; ++t) {
                        const float a = av[t];
                        const float* b = bv + t * W;
                        for (std::size_t j = 0; j < W; ++j) group_sum[j] += a * b[j];
                    }
                    for (std::size_t j = 0; j < W; ++j) {
                        term[g][j] = group_sum[j] * sas[blk] * sbs[blk * W + j];
                        scale_exp[g][j] = sae[blk] + sbe[blk * W + j];
                        const bool joins = mmasim || term[g][j] != 0.0f;
                        emax[j] = std::max(emax[j], joins ? scale_exp[g][j] : none);
                    }
                }
                // Level two: units of 2^(emax - F), each term cut toward zero on its own. A joining
                // term's power is at most 2^F; below 2^-126 the term (below 2^24) is below 1.
                for (std::size_t j = 0; j < W; ++j) sum[j] = lane_whole(term[0][j] * block_pow2(scale_exp[0][j] + F - emax[j]));
                for (std::size_t g = 1; g < G; ++g)
                    for (std::size_t j = 0; j < W; ++j) sum[j] += lane_whole(term[g][j] * block_pow2(scale_exp[g][j] + F - emax[j]));
            }
            // The accumulator aligned the same way: C joined the search, so its significand (in
            // [1, 2), the exponent field set to 127's) times 2^(F - emax + ec) is below 2^(F + 1),
            // and below 1 where the power is below 2^-126. The exact sum, cut toward zero to 24
            // bits in a double, converts exactly to float; scaling it back is an add to its
            // exponent field where the result is a normal float, and a result outside float32's
            // normal range marks its lane. Integer compares and bit blends: selects of floats would
            // be branches under -ftrapping-math, and this loop runs in vector lanes.
            // In two loops, each of one element width (the 64-bit sums, then the 32-bit cut and
            // blend): GCC 12 vectorises both, where one loop of both widths stayed scalar without
            // AVX-512 ("no vectype" for its float loads).
            alignas(64) std::array<float, W> cut_sum{};
            for (std::size_t j = 0; j < W; ++j) {
                const auto bits = std::bit_cast<std::uint32_t>(c[j]);
                const std::uint32_t nonzero = 0 - static_cast<std::uint32_t>((bits & 0x7fffffffu) != 0);
                const auto ec = static_cast<std::int32_t>((bits >> 23) & 0xffu) - 127;
                const float significand = std::bit_cast<float>(((bits & 0x807fffffu) | 0x3f800000u) & nonzero);
                const lane_exact_sum c_aligned = lane_whole(significand * block_pow2(F - emax[j] + ec));
                const auto exact = static_cast<double>(sum[j] + c_aligned);  // below 2^53: exact
                constexpr std::uint64_t cut_mask = ~((std::uint64_t{1} << (52 - 23)) - 1);
                cut_sum[j] = static_cast<float>(std::bit_cast<double>(std::bit_cast<std::uint64_t>(exact) & cut_mask));
            }
            for (std::size_t j = 0; j < W; ++j) {
                const auto cut = std::bit_cast<std::uint32_t>(cut_sum[j]);
                const std::int32_t shift = emax[j] - F;
                const std::int32_t field = static_cast<std::int32_t>((cut >> 23) & 0xffu) + shift;
                const bool zero = (cut & 0x7fffffffu) == 0;
                const bool fits = zero || (field >= 1 && field <= 254);
                unsure[j] |= fits ? 0 : 1;
                const std::uint32_t keep = 0 - static_cast<std::uint32_t>(unsure[j] == 0 && !zero);
                c[j] = std::bit_cast<float>((cut + (static_cast<std::uint32_t>(shift) << 23)) & keep);
            }
        }
    }
    for (std::size_t r = 0; r < rows; ++r) {
        std::uint32_t mask = 0;
        for (std::size_t j = 0; j < W; ++j) {
            lane_out[r * W + j] = accumulators[r][j];
            mask |= static_cast<std::uint32_t>(unsures[r][j] != 0) << j;
        }
        masks[r] = mask;
    }
}

/// One output (i, j) of Model's block-scaled GEMM on the reference engine: a chain of
/// block_inner_product_of along K, a last, shorter instruction padded with zero operands and the
/// last block's scales.
template <BlockGemmModel Model, class TA, class TB, class S>
[[nodiscard]] float block_gemm_output(const TA* a, const S* sa, const TB* b, const S* sb, std::size_t i, std::size_t j,
                                      std::size_t k, std::size_t n)
{
    using I = typename Model::instruction;
    constexpr std::size_t B = I::scale_block;
    const operand zero{};
    const auto one = [&](std::size_t s, std::size_t len, float acc) {
        const std::size_t last = (s + len - 1) / B;  // the last block this step reads
        return block_inner_product_of<I>(
            [&](std::size_t t) { return t < len ? decompose(a[i * k + s + t]) : zero; },
            [&](std::size_t t) { return t < len ? decompose(b[(s + t) * n + j]) : zero; },
            [&](std::size_t q) { return decode_scale_of<I::scale>(sa[i * (k / B) + std::min(s / B + q, last)]); },
            [&](std::size_t q) { return decode_scale_of<I::scale>(sb[std::min(s / B + q, last) * n + j]); }, acc);
    };
    return chain_along_k<Model::promotion_interval>(k, I::k, one);
}

/// out (M x N) = Model's block-scaled GEMM of a (M x K, scales sa M x K/B) and b (K x N, scales sb
/// K/B x N), all row-major: in lanes where block_lane_fit holds (tasks of one row by lane_width
/// columns, shared among threads), each output whose chain meets a NaN or inf code, a NaN scale or
/// a result outside float32's normal range again on the reference engine.
template <BlockGemmModel Model, class TA, class TB, class S>
void block_gemm_into(const TA* a, const S* sa, const TB* b, const S* sb, std::size_t m, std::size_t k, std::size_t n,
                     float* out)
{
    using I = typename Model::instruction;
    const auto exact = [=](std::size_t i, std::size_t j) { return block_gemm_output<Model>(a, sa, b, sb, i, j, k, n); };
    if constexpr (!block_lane_fit<I, TA, TB>::usable || Model::promotion_interval != 0) {
        scalify::detail::parallel_for(m * n, [&](std::size_t t) { out[t] = exact(t / n, t % n); });
    } else {
        constexpr std::size_t W = lane_width, B = I::scale_block;
        constexpr auto zero_exponent = static_cast<std::int16_t>(block_zero_exponent<I>);
        const std::size_t kp = (k + I::k - 1) / I::k * I::k, nb = kp / B, kb = k / B, blocks = (n + W - 1) / W;
        thread_local std::vector<float> a_val, b_val, sa_sig, sb_sig;
        thread_local std::vector<std::int16_t> a_exp, b_exp;
        thread_local std::vector<std::int32_t> sa_exp, sb_exp;
        thread_local std::vector<unsigned char> special_row;
        thread_local std::vector<std::uint32_t> special_block;
        a_val.resize(m * kp);
        a_exp.resize(m * kp);
        b_val.resize(blocks * kp * W);
        b_exp.resize(blocks * kp * W);
        sa_sig.resize(m * nb);
        sa_exp.resize(m * nb);
        sb_sig.resize(blocks * nb * W);
        sb_exp.resize(blocks * nb * W);
        special_row.assign(m, 0);
        special_block.assign(blocks, 0);
        const auto scale_of = [](const S& x, std::int32_t& exponent, float& significand) {
            const scale_value v = decode_scale_of<I::scale>(x);
            exponent = v.exponent;
            significand = static_cast<float>(v.significand) * std::ldexp(1.0f, v.lsb - v.exponent);
            return v.nan;
        };
        // Pointers, not the thread_local names: inside the loops those would be each worker's own.
        float* const av = a_val.data();
        std::int16_t* const ae = a_exp.data();
        float* const bv = b_val.data();
        std::int16_t* const be = b_exp.data();
        float* const sas = sa_sig.data();
        std::int32_t* const sae = sa_exp.data();
        float* const sbs = sb_sig.data();
        std::int32_t* const sbe = sb_exp.data();
        unsigned char* const rows = special_row.data();
        std::uint32_t* const columns = special_block.data();
        scalify::detail::parallel_for(m, [=](std::size_t i) {
            bool special = false;
            for (std::size_t t = 0; t < kp; ++t) {
                const lane_operand o = t < k ? lane_decode(a[i * k + t]) : lane_operand{0.0f, lane_zero_exponent, false};
                av[i * kp + t] = o.value;
                ae[i * kp + t] = o.exponent == lane_zero_exponent ? zero_exponent : o.exponent;
                special = special || o.special;
            }
            for (std::size_t q = 0; q < nb; ++q)
                special = scale_of(sa[i * kb + std::min(q, kb - 1)], sae[i * nb + q], sas[i * nb + q]) || special;
            rows[i] = special ? 1 : 0;
        });
        scalify::detail::parallel_for(blocks, [=](std::size_t block) {
            const std::size_t j0 = block * W, width = std::min(W, n - j0);
            std::uint32_t special = 0;
            for (std::size_t t = 0; t < kp; ++t) {
                for (std::size_t j = 0; j < W; ++j) {
                    const lane_operand o = t < k && j < width ? lane_decode(b[t * n + j0 + j])
                                                              : lane_operand{0.0f, lane_zero_exponent, false};
                    const std::size_t at = (block * kp + t) * W + j;
                    bv[at] = o.value;
                    be[at] = o.exponent == lane_zero_exponent ? zero_exponent : o.exponent;
                    special |= static_cast<std::uint32_t>(o.special) << j;
                }
            }
            for (std::size_t q = 0; q < nb; ++q) {
                for (std::size_t j = 0; j < W; ++j) {
                    const std::size_t at = (block * nb + q) * W + j;
                    if (j < width) {
                        special |= static_cast<std::uint32_t>(scale_of(sb[std::min(q, kb - 1) * n + j0 + j], sbe[at], sbs[at])) << j;
                    } else {
                        sbe[at] = 0;
                        sbs[at] = 1.0f;
                    }
                }
            }
            columns[block] = special;
        });
        const block_panels panels{av, ae, bv, be, sae, sas, sbe, sbs, kp, nb};
        // Tasks of block_task_rows rows by one block of columns, the rows of one block in turn.
        constexpr std::size_t R = block_task_rows;
        const std::size_t row_tasks = (m + R - 1) / R;
        scalify::detail::parallel_for(row_tasks * blocks, [&, rows, columns](std::size_t task) {
            const std::size_t i0 = (task % row_tasks) * R, block = task / row_tasks, height = std::min(R, m - i0);
            const std::size_t j0 = block * W, width = std::min(W, n - j0);
            alignas(64) float lane_out[R * W];
            std::uint32_t masks[R];
            block_lane_chain<I>(panels, i0, height, block, lane_out, masks);
            for (std::size_t r = 0; r < height; ++r) {
                const std::size_t i = i0 + r;
                const std::uint32_t unsure = masks[r] | columns[block] | (rows[i] != 0 ? ~std::uint32_t{0} : 0u);
                for (std::size_t j = 0; j < width; ++j)
                    out[i * n + j0 + j] = (unsure >> j) & 1u ? exact(i, j0 + j) : lane_out[r * W + j];
            }
        });
    }
}

}  // namespace detail

/// One block-scaled instruction's result for one output: c + sum_k (a[k] sa[k/B]) (b[k] sb[k/B]),
/// B = Model::scale_block, bit for bit as MMA-Sim computes it. shape_error unless a and b hold
/// Model::k elements and scale_a, scale_b Model::scales each. Scales: float8_e8m0fnu (UE8M0 units)
/// or float8_e4m3fn read as UE4M3 (b200_nvfp4).
template <BlockScaledModel Model, class TA, class TB, class S>
[[nodiscard]] float dot(std::span<const TA> a, std::span<const TB> b, float c, std::span<const S> scale_a,
                        std::span<const S> scale_b)
{
    static_assert(Model::template takes<TA, TB>,
                  "this block-scaled model does not take these operand types (b200_mxf8f6f4: float8_e4m3fn, "
                  "float8_e5m2, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn in any pair; b200_nvfp4, b200_mxf4: "
                  "float4_e2m1fn)");
    static_assert(std::same_as<S, typename Model::scale_type>,
                  "block scales: float8_e8m0fnu for b200_mxf8f6f4 and b200_mxf4, float8_e4m3fn (UE4M3) for b200_nvfp4");
    if (a.size() != Model::k || b.size() != Model::k || scale_a.size() != Model::scales || scale_b.size() != Model::scales) {
        SCALIFY_THROW(shape_error(fmt::format("tensor_core::dot<{}>: {} and {} elements with {} and {} scales; the "
                                              "instruction takes K = {} of each and {} scales per operand",
                                              Model::name, a.size(), b.size(), scale_a.size(), scale_b.size(), Model::k,
                                              Model::scales)));
    }
    return detail::block_inner_product_of<Model>(
        [&a](std::size_t i) { return detail::decompose(a[i]); }, [&b](std::size_t i) { return detail::decompose(b[i]); },
        [&scale_a](std::size_t j) { return detail::decode_scale_of<Model::scale>(scale_a[j]); },
        [&scale_b](std::size_t j) { return detail::decode_scale_of<Model::scale>(scale_b[j]); }, c);
}

/// dot over contiguous ranges (std::array, std::vector): dot<Model>(a, b, c, scale_a, scale_b).
template <BlockScaledModel Model, std::ranges::contiguous_range RA, std::ranges::contiguous_range RB,
          std::ranges::contiguous_range RS>
    requires(!detail::is_const_span<std::remove_cvref_t<RA>> || !detail::is_const_span<std::remove_cvref_t<RB>> ||
             !detail::is_const_span<std::remove_cvref_t<RS>>)
[[nodiscard]] float dot(const RA& a, const RB& b, float c, const RS& scale_a, const RS& scale_b)
{
    using TA = std::ranges::range_value_t<RA>;
    using TB = std::ranges::range_value_t<RB>;
    using S = std::ranges::range_value_t<RS>;
    return dot<Model, TA, TB, S>(std::span<const TA>(std::ranges::data(a), std::ranges::size(a)),
                                 std::span<const TB>(std::ranges::data(b), std::ranges::size(b)), c,
                                 std::span<const S>(std::ranges::data(scale_a), std::ranges::size(scale_a)),
                                 std::span<const S>(std::ranges::data(scale_b), std::ranges::size(scale_b)));
}

/// dot for a model with one scale per operand and instruction (b200_mxf8f6f4): the scales as values.
template <BlockScaledModel Model, std::ranges::contiguous_range RA, std::ranges::contiguous_range RB>
    requires(Model::scales == 1)
[[nodiscard]] float dot(const RA& a, const RB& b, float c, typename Model::scale_type scale_a,
                        typename Model::scale_type scale_b)
{
    using S = typename Model::scale_type;
    return dot<Model>(a, b, c, std::array<S, 1>{scale_a}, std::array<S, 1>{scale_b});
}

/// a (M x K) . b (K x N) with scale_a (M x K/B) and scale_b (K/B x N), B = the instruction's scale
/// block, as Model's GEMM computes it: per output, instructions over k = 0, k, 2k, ... chained
/// from C = +0 (detail::chain_along_k, the chain of every GEMM model). K must be a multiple of B; a last, shorter instruction is padded with zero operands
/// (and the scales of the last block). shape_error otherwise.
template <BlockGemmModel Model, class TA, class TB, class S>
[[nodiscard]] xt::xarray<float> block_gemm(const xt::xarray<TA>& a, const xt::xarray<S>& scale_a, const xt::xarray<TB>& b,
                                           const xt::xarray<S>& scale_b)
{
    using I = typename Model::instruction;
    static_assert(I::template takes<TA, TB>, "this block-scaled GEMM's instruction does not take these operand types");
    static_assert(std::same_as<S, typename I::scale_type>, "block scales: float8_e8m0fnu, or float8_e4m3fn for b200_nvfp4");
    constexpr std::size_t B = I::scale_block;
    if (a.dimension() != 2 || b.dimension() != 2 || a.shape()[1] != b.shape()[0] || a.shape()[1] % B != 0 ||
        scale_a.dimension() != 2 || scale_b.dimension() != 2 || scale_a.shape()[0] != a.shape()[0] ||
        scale_a.shape()[1] != a.shape()[1] / B || scale_b.shape()[0] != a.shape()[1] / B ||
        scale_b.shape()[1] != b.shape()[1]) {
        SCALIFY_THROW(shape_error(fmt::format("tensor_core::block_gemm<{}>: data {} and {} with scales {} and {} (need (M, K), "
                                              "(K, N), (M, K/{}), (K/{}, N) with K a multiple of {})",
                                              Model::name, shape_string(a.shape()), shape_string(b.shape()),
                                              shape_string(scale_a.shape()), shape_string(scale_b.shape()), B, B, B)));
    }
    const std::size_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
    auto out = xt::xarray<float>::from_shape({m, n});
    detail::block_gemm_into<Model>(a.data(), scale_a.data(), b.data(), scale_b.data(), m, k, n, out.data());
    return out;
}

/// block_gemm over BlockScaledArrays: a with 1 x B blocks (scales along K, as
/// quantize_mx(x, 1) makes), b with B x 1 blocks (quantize_mx(w, 0)). E8M0 models only
/// (BlockScaledArray holds float or E8M0 scales). shape_error for other blockings.
template <BlockGemmModel Model, class TA, class TB>
[[nodiscard]] xt::xarray<float> gemm(const BlockScaledArray<TA, float8_e8m0fnu>& a, const BlockScaledArray<TB, float8_e8m0fnu>& b)
{
    constexpr std::size_t B = Model::instruction::scale_block;
    if (a.block_rows() != 1 || a.block_cols() != B || b.block_rows() != B || b.block_cols() != 1) {
        SCALIFY_THROW(shape_error(fmt::format("tensor_core::gemm<{}>: blocks {}x{} and {}x{}; the unit takes 1x{} for A and "
                                              "{}x1 for B",
                                              Model::name, a.block_rows(), a.block_cols(), b.block_rows(), b.block_cols(),
                                              B, B)));
    }
    return block_gemm<Model>(a.data(), a.scales(), b.data(), b.scales());
}

}  // namespace scalify::tensor_core
