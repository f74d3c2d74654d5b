#pragma once
/// \file tensor_core/amx.hpp
/// Intel's 16-bit matrix and vector units, bit for bit: AMX TDPBF16PS (amx_bf16) and AVX512_BF16
/// VDPBF16PS (avx512_bf16), measured on a Xeon with AMX-BF16 (Sapphire or Emerald Rapids: the VM
/// hides which; tools/capture_amx.cpp, tests/data/amx/); and AMX-FP16 TDPFP16PS (amx_fp16), not
/// captured (below). None fits inner_product_model: they do not align a block of products to one
/// exponent but chain float32 fused multiply-adds, each rounded to nearest even, with bf16 and
/// accumulator subnormals read as zero (DAZ) and subnormal results flushed to zero (FTZ):
///
/// - TDPBF16PS, per output, K = 2 * pairs (pairs = the A tile's colsb / 4, at most 16):
///       even = +0; odd = +0
///       for p in 0 .. pairs-1:  even = fma(a[2p], b[2p], even);  odd = fma(a[2p+1], b[2p+1], odd)
///       d = c + (even + odd)
/// - VDPBF16PS, per float32 lane (K = 2):  d = fma(a[0], b[0], fma(a[1], b[1], c))
///
/// Every step (fma or add) is one float32 operation rounded to nearest even as if the exponent
/// were unbounded, then flushed to a zero of its sign if below 2^-126 (tininess after rounding);
/// overflow gives inf. NaN: an operand's NaN, quieted, the first in the order (a, b, accumulator)
/// of each fma (so a later product's NaN replaces the chain's) and (left, right) of each add;
/// inf * 0 and inf - inf give 0xffc00000 (x86's default NaN). MXCSR is neither read nor written
/// (the capture ran under two MXCSR settings with the same bits).
///
/// AMX-FP16 TDPFP16PS (Granite Rapids), amx_fp16: an extrapolation, not a capture (no CPU here
/// has AMX-FP16). From the SDM (and LLVM's amxfp16intrin.h): the same Operation pseudo-code as
/// TDPBF16PS with fp16 operands widened to float32; RNE on each FMA; output float32 denormals
/// flushed; input fp16 denormals handled, not read as zero; MXCSR not consulted. From the
/// measured TDPBF16PS unit: the order (two lanes from +0, then c + (even + odd); the SDM's
/// pseudo-code reads as one sequential += chain for TDPBF16PS too, and the hardware does not run
/// it that way), FTZ after rounding on every step, the NaN rules. Unknown, taken from TDPBF16PS:
/// whether a float32 subnormal accumulator C is read as zero (here: yes, DAZ; the SDM says
/// nothing of it). A capture would decide between this and the SDM's literal order (one chain
/// from C, products in increasing k). Every fp16 value, subnormals included, is a normal float32
/// or a zero, and fp16 products (22 significant bits, 2^-48 to 2^32) are exact, so DAZ on the
/// widened operands never changes one.
///
///     std::array<Eigen::bfloat16, 32> a{...}, b{...};
///     float d = tensor_core::dot<tensor_core::amx_bf16>(a, b, 0.0f);          // one TDPBF16PS output
///     auto y = tensor_core::gemm<tensor_core::amx_bf16_gemm>(x, w);           // chained along K
///     auto z = tensor_core::gemm<tensor_core::amx_fp16_gemm>(xh, wh);         // Eigen::half operands
///
/// The instructions are MatrixInstructions and their GEMMs gemm_model tags (fma_gemm_model<I> is
/// gemm_model<I, 0>): gemm and gemm_dot are the ones of gemm.hpp, this header supplies their
/// engine (detail::gemm_engine<FmaChainModel>); dot takes them through an overload constrained on
/// FmaChainModel. docs: the AMX section of docs/tensor_core.md.

#include <scalify/detail/parallel.hpp>
#include <scalify/error.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/tensor_core/dot.hpp>
#include <scalify/tensor_core/gemm.hpp>
#include <scalify/tensor_core/model.hpp>

#include <fmt/format.h>
#include <xtensor/xarray.hpp>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

namespace scalify::tensor_core {

// ---------------------------------------------------------------------------------------------
// Models

/// How a chained-FMA instruction orders its products.
enum class fma_chain_order {
    /// AMX TDPBF16PS: two chains from +0, one over the even products and one over the odd ones, in
    /// increasing k; then c + (even + odd).
    two_lanes_then_accumulator,
    /// AVX512_BF16 VDPBF16PS: one chain from c, product 1 first, then product 0.
    odd_then_even
};

/// An instruction of chained float32 FMAs (DAZ on inputs, FTZ on every result, round to nearest
/// even): K products at most per call, in pairs, ordered as Order says.
template <std::size_t K, class Operands, fma_chain_order Order>
struct fma_chain_model : instruction_of<Operands, K> {
    static_assert(K >= 2 && K % 2 == 0 && K <= 4096, "K must be an even number of products in [2, 4096]");
    static constexpr fma_chain_order order = Order;
};

/// A tag describing one chained-FMA instruction: derived from fma_chain_model, with a name.
template <class M>
concept FmaChainModel = std::is_base_of_v<fma_chain_model<M::k, typename M::operands, M::order>, M> && requires {
    { M::name } -> std::convertible_to<const char*>;
};

template <class M, class TA, class TB>
concept FmaChainModelFor = FmaChainModel<M> && M::template takes<TA, TB>;

/// Intel AMX-BF16 TDPBF16PS (Sapphire Rapids and later), one output of a tile: up to 16 pairs of
/// bf16 products (K = 32; a tile of colsb = 2K bytes takes K < 32), even and odd products in two
/// float32 FMA chains, then c + (even + odd). Measured: every captured output bit for bit.
struct amx_bf16 : fma_chain_model<32, same_type_of<Eigen::bfloat16>, fma_chain_order::two_lanes_then_accumulator> {
    static constexpr const char* name = "amx_bf16";
};

/// Intel AMX-FP16 TDPFP16PS (Granite Rapids), one output of a tile: amx_bf16's datapath with
/// fp16 operands, read exactly (fp16 subnormals are not flushed); a float32 subnormal C is read as
/// zero as on TDPBF16PS. Not captured: the SDM's rules on the measured TDPBF16PS order (the file
/// comment says which part comes from where).
struct amx_fp16 : fma_chain_model<32, same_type_of<Eigen::half>, fma_chain_order::two_lanes_then_accumulator> {
    static constexpr const char* name = "amx_fp16";
};

/// Intel AVX512_BF16 VDPBF16PS (Cooper Lake, Sapphire Rapids, Zen 4 and later), one float32 lane:
/// fma(a[0], b[0], fma(a[1], b[1], c)). Measured on the same Xeon only (Cooper Lake and Zen 4 not
/// captured).
struct avx512_bf16 : fma_chain_model<2, same_type_of<Eigen::bfloat16>, fma_chain_order::odd_then_even> {
    static constexpr const char* name = "avx512_bf16";
};

/// A GEMM of chained-FMA instructions, one chain: gemm_model's (Instruction::k products at a time
/// along K in increasing k, each instruction's result the next one's accumulator, from +0). The
/// last instruction takes what is left (a narrower tile); an odd K ends with a zero product.
template <FmaChainModel Instruction>
using fma_gemm_model = gemm_model<Instruction, 0>;

/// A GEMM model whose instruction chains FMAs.
template <class M>
concept FmaGemmModel = GemmModel<M> && FmaChainModel<typename M::instruction>;

template <class M, class TA, class TB>
concept FmaGemmModelFor = FmaGemmModel<M> && FmaChainModelFor<typename M::instruction, TA, TB>;

/// A bf16 GEMM on AMX as a kernel that keeps its C tiles across the K loop runs it: 32 of K per
/// TDPBF16PS, in increasing k. The instruction is measured; the chain along K is the natural
/// order, not a captured library GEMM (oneDNN's, for one, was not captured).
struct amx_bf16_gemm : fma_gemm_model<amx_bf16> {
    static constexpr const char* name = "amx_bf16_gemm";
};

/// An fp16 GEMM on AMX-FP16 tiles: 32 of K per TDPFP16PS, in increasing k, C kept across K (the
/// natural order, as amx_bf16_gemm; the instruction itself is not captured).
struct amx_fp16_gemm : fma_gemm_model<amx_fp16> {
    static constexpr const char* name = "amx_fp16_gemm";
};

/// A bf16 GEMM on AVX512_BF16: one float32 accumulator per output, VDPBF16PS along K two products
/// at a time (the natural order; not a captured library GEMM).
struct avx512_bf16_gemm : fma_gemm_model<avx512_bf16> {
    static constexpr const char* name = "avx512_bf16_gemm";
};

// ---------------------------------------------------------------------------------------------
// The arithmetic, on float32 bit patterns

namespace detail::fma_chain {

inline constexpr std::uint32_t default_nan = 0xffc00000u;  // x86's QNaN floating-point indefinite

[[nodiscard]] constexpr bool is_nan(std::uint32_t x) noexcept { return (x & 0x7fffffffu) > 0x7f800000u; }
[[nodiscard]] constexpr bool is_inf(std::uint32_t x) noexcept { return (x & 0x7fffffffu) == 0x7f800000u; }
[[nodiscard]] constexpr bool is_zero_or_subnormal(std::uint32_t x) noexcept { return (x & 0x7f800000u) == 0; }
/// DAZ: a subnormal reads as the zero of its sign.
[[nodiscard]] constexpr std::uint32_t daz(std::uint32_t x) noexcept { return is_zero_or_subnormal(x) ? x & 0x80000000u : x; }

/// A nonzero normal float32 as sig * 2^lsb.
struct exact {
    std::uint64_t sig;
    int lsb;
    bool negative;
};
[[nodiscard]] constexpr exact split(std::uint32_t x) noexcept
{
    const int field = static_cast<int>((x >> 23) & 0xffu);
    return {(x & 0x7fffffu) | 0x800000u, field - 150, (x >> 31) != 0};
}

/// The float32 nearest (ties to even, exponent unbounded) to (-1)^negative * magnitude * 2^lsb,
/// magnitude > 0; +-inf from 2^128, a zero of the sign below 2^-126 (FTZ after rounding).
[[nodiscard]] constexpr std::uint32_t round_ftz(std::uint64_t magnitude, int lsb, bool negative) noexcept
{
    const std::uint32_t sign = negative ? 0x80000000u : 0u;
    int width = static_cast<int>(std::bit_width(magnitude));
    if (width > 24) {
        const int shift = width - 24;
        const std::uint64_t kept = magnitude >> shift;
        const std::uint64_t rest = magnitude - (kept << shift);
        const std::uint64_t half = std::uint64_t{1} << (shift - 1);
        magnitude = kept + ((rest > half || (rest == half && (kept & 1) != 0)) ? 1 : 0);
        lsb += shift;
        if (magnitude >> 24) {  // rounded up to 2^24
            magnitude >>= 1;
            ++lsb;
        }
        width = 24;
    }
    const int top = lsb + width - 1;
    if (top >= 128) return sign | 0x7f800000u;
    if (top < -126) return sign;
    const auto significand = static_cast<std::uint32_t>(magnitude << (24 - width));
    return sign | static_cast<std::uint32_t>(top + 127) << 23 | (significand & 0x7fffffu);
}

/// x * y + z as one float32 operation of the measured units: DAZ on x, y and z, the exact result
/// rounded to nearest even, FTZ. NaN: the first NaN of x, y, z, quieted; inf * 0 and inf - inf
/// give the default NaN.
[[nodiscard]] constexpr std::uint32_t fma(std::uint32_t x, std::uint32_t y, std::uint32_t z) noexcept
{
    for (const std::uint32_t v : {x, y, z})
        if (is_nan(v)) return v | 0x400000u;
    x = daz(x);
    y = daz(y);
    z = daz(z);
    const bool product_negative = ((x ^ y) >> 31) != 0;
    const bool x_zero = (x & 0x7fffffffu) == 0, y_zero = (y & 0x7fffffffu) == 0;
    if (is_inf(x) || is_inf(y)) {
        if (x_zero || y_zero) return default_nan;
        if (is_inf(z) && ((z >> 31) != 0) != product_negative) return default_nan;
        return product_negative ? 0xff800000u : 0x7f800000u;
    }
    if (is_inf(z)) return z;
    const bool z_zero = (z & 0x7fffffffu) == 0;
    if (x_zero || y_zero) {
        if (!z_zero) return z;
        return product_negative && (z >> 31) != 0 ? 0x80000000u : 0u;  // -0 only for -0 + -0
    }
    const exact a = split(x), b = split(y);
    const exact p{a.sig * b.sig, a.lsb + b.lsb, product_negative};
    if (z_zero) return round_ftz(p.sig, p.lsb, p.negative);
    const exact c = split(z);
    // A common last place, no lower than 60 bits below the larger term's top (so both fit 61
    // bits): a term partly or wholly below it keeps a sticky bit, exact enough since the larger
    // term's last place, and so the result's, is then 35 or more bits above it (terms that
    // cancel lie within a few bits of each other and are never cut).
    const int p_top = p.lsb + static_cast<int>(std::bit_width(p.sig)) - 1;
    const int c_top = c.lsb + 23;
    const int lsb = std::max(std::min(p.lsb, c.lsb), std::max(p_top, c_top) - 60);
    const auto aligned = [lsb](const exact& t) -> std::uint64_t {
        if (t.lsb >= lsb) return t.sig << (t.lsb - lsb);
        const int shift = lsb - t.lsb;
        if (shift >= 64) return 1;  // sticky
        return (t.sig >> shift) | ((t.sig & ((std::uint64_t{1} << shift) - 1)) != 0 ? 1 : 0);
    };
    const std::uint64_t pa = aligned(p), ca = aligned(c);
    if (p.negative == c.negative) return round_ftz(pa + ca, lsb, p.negative);
    if (pa == ca) return 0u;  // an exact zero sum is +0
    return pa > ca ? round_ftz(pa - ca, lsb, p.negative) : round_ftz(ca - pa, lsb, c.negative);
}

/// x + y: fma(x, 1, y), so with the NaN order (x, y).
[[nodiscard]] constexpr std::uint32_t add(std::uint32_t x, std::uint32_t y) noexcept { return fma(x, 0x3f800000u, y); }

/// The float32 bits of a bf16 operand (make_fp32 in the SDM).
[[nodiscard]] inline std::uint32_t widen(Eigen::bfloat16 x) noexcept
{
    return static_cast<std::uint32_t>(std::bit_cast<std::uint16_t>(x)) << 16;
}

/// The float32 bits of an fp16 operand, exactly, computed on the bits (a hardware conversion's
/// NaN handling varies): subnormals normalised (every fp16 value is a normal float32 or a zero),
/// infinities kept, a NaN's payload shifted left 13 (the chain quiets NaNs anyway).
[[nodiscard]] inline std::uint32_t widen(Eigen::half x) noexcept
{
    const std::uint32_t h = std::bit_cast<std::uint16_t>(x);
    const std::uint32_t sign = (h & 0x8000u) << 16;
    const std::uint32_t field = (h >> 10) & 0x1fu;
    const std::uint32_t fraction = h & 0x3ffu;
    if (field == 0x1fu) return sign | 0x7f800000u | fraction << 13;
    if (field != 0) return sign | (field + 112u) << 23 | fraction << 13;  // 127 - 15 = 112
    if (fraction == 0) return sign;
    // fraction * 2^-24 with bit_width w: top bit 2^(w - 25), exponent field w + 102.
    const auto w = static_cast<std::uint32_t>(std::bit_width(fraction));
    return sign | (w + 102u) << 23 | ((fraction << (24u - w)) & 0x7fffffu);
}

/// No other operand type: no conversion to bf16 or fp16 on the way.
template <class T>
std::uint32_t widen(const T&) = delete;

/// One instruction over n products (n even, n <= Model::k) of float32-widened operands.
template <FmaChainModel Model>
[[nodiscard]] constexpr std::uint32_t instruction(const std::uint32_t* a, const std::uint32_t* b, std::size_t n,
                                                  std::uint32_t c) noexcept
{
    if constexpr (Model::order == fma_chain_order::two_lanes_then_accumulator) {
        std::uint32_t even = 0, odd = 0;
        for (std::size_t i = 0; i + 1 < n; i += 2) {
            even = fma(a[i], b[i], even);
            odd = fma(a[i + 1], b[i + 1], odd);
        }
        return add(c, add(even, odd));
    } else {
        std::uint32_t acc = c;
        for (std::size_t i = 0; i + 1 < n; i += 2) {
            acc = fma(a[i + 1], b[i + 1], acc);
            acc = fma(a[i], b[i], acc);
        }
        return acc;
    }
}

/// One output of Model's GEMM over k products (widened operands; k odd: a zero product ends it).
template <FmaGemmModel Model>
[[nodiscard]] std::uint32_t chain(const std::uint32_t* a, const std::uint32_t* b, std::size_t k) noexcept
{
    using I = typename Model::instruction;
    constexpr std::size_t step = I::k;
    // The accumulator travels as a float's bits (copies keep every NaN payload).
    const auto one = [=](std::size_t s, std::size_t count, float c) {
        const auto acc = std::bit_cast<std::uint32_t>(c);
        if (count == step) return std::bit_cast<float>(instruction<I>(a + s, b + s, step, acc));
        std::uint32_t ta[step] = {}, tb[step] = {};
        std::copy(a + s, a + s + count, ta);
        std::copy(b + s, b + s + count, tb);
        return std::bit_cast<float>(instruction<I>(ta, tb, (count + 1) / 2 * 2, acc));
    };
    return std::bit_cast<std::uint32_t>(chain_along_k<Model::promotion_interval>(k, step, one));
}

inline constexpr std::size_t lane_width = 32;

/// Whether a float step's result may differ from fma()'s: NaN (the payload rule), or nonzero and
/// at most 2^-126 (the flush after rounding). Elsewhere a float operation rounded to nearest even
/// gives fma()'s bits (inputs never subnormal: bf16 operands are flushed when decoded, fp16 ones
/// widen to normal floats or zeros, every step's result is checked), zeros and infinities included.
[[nodiscard]] inline std::uint32_t unsure(float r) noexcept
{
    // On the bits (integer compares vectorise; float ones would branch under -ftrapping-math).
    const std::uint32_t m = std::bit_cast<std::uint32_t>(r) & 0x7fffffffu;
    return static_cast<std::uint32_t>(m - 1u < 0x00800000u) | static_cast<std::uint32_t>(m > 0x7f800000u);
}

/// lane_width outputs of Model's GEMM in float lanes, with the CPU's FMA: a_row holds K operands
/// (DAZ applied, K even), b_block K rows of lane_width (the same). Returns a mask of the outputs
/// whose chain met a result unsure() calls unsafe (recomputed by chain()). Needs round to nearest.
template <FmaGemmModel Model>
[[nodiscard]] std::uint32_t lanes(const float* a_row, const float* b_block, std::size_t k, float* out) noexcept
{
    constexpr std::size_t W = lane_width;
    constexpr std::size_t step = Model::instruction::k;
    alignas(64) float acc[W] = {}, even[W], odd[W];
    // unsure() over a lane's whole chain as two running extremes of the results' magnitude bits:
    // the least of (bits - 1) (a zero wraps to the top, out of the way) and the greatest. Four
    // integer operations per result instead of seven.
    alignas(64) std::uint32_t low[W], high[W] = {};
    for (std::size_t j = 0; j < W; ++j) low[j] = ~std::uint32_t{0};
    const auto track = [&](std::size_t j, float r) {
        const std::uint32_t m = std::bit_cast<std::uint32_t>(r) & 0x7fffffffu;
        low[j] = std::min(low[j], m - 1u);
        high[j] = std::max(high[j], m);
    };
    for (std::size_t s = 0; s < k; s += step) {
        const std::size_t end = std::min(s + step, k);
        if constexpr (Model::instruction::order == fma_chain_order::two_lanes_then_accumulator) {
            for (std::size_t j = 0; j < W; ++j) even[j] = odd[j] = 0.0f;
            for (std::size_t p = s; p < end; p += 2) {
                const float a0 = a_row[p], a1 = a_row[p + 1];
                const float* b0 = b_block + p * W;
                const float* b1 = b0 + W;
                for (std::size_t j = 0; j < W; ++j) {
                    even[j] = std::fma(a0, b0[j], even[j]);
                    odd[j] = std::fma(a1, b1[j], odd[j]);
                    track(j, even[j]);
                    track(j, odd[j]);
                }
            }
            for (std::size_t j = 0; j < W; ++j) {
                const float lanes_sum = even[j] + odd[j];
                acc[j] = acc[j] + lanes_sum;
                track(j, lanes_sum);
                track(j, acc[j]);
            }
        } else {
            for (std::size_t p = s; p < end; p += 2) {
                const float a0 = a_row[p], a1 = a_row[p + 1];
                const float* b0 = b_block + p * W;
                const float* b1 = b0 + W;
                for (std::size_t j = 0; j < W; ++j) {
                    const float first = std::fma(a1, b1[j], acc[j]);
                    acc[j] = std::fma(a0, b0[j], first);
                    track(j, first);
                    track(j, acc[j]);
                }
            }
        }
    }
    std::uint32_t mask = 0;
    for (std::size_t j = 0; j < W; ++j) {
        out[j] = acc[j];
        // unsure(): some result nonzero and at most 2^-126 (bits - 1 below 0x00800000), or NaN.
        const bool bad = low[j] < 0x00800000u || high[j] > 0x7f800000u;
        mask |= (bad ? 1u : 0u) << j;
    }
    return mask;
}

/// The float an operand's widened bits stand for in the lanes: DAZ applied (a no-op on a widened
/// fp16 operand, never a float32 subnormal).
[[nodiscard]] inline float lane_value(std::uint32_t widened) noexcept { return std::bit_cast<float>(daz(widened)); }

template <FmaChainModel Model, class TA, class TB>
constexpr void check_operands() noexcept
{
    static_assert(Model::template takes<TA, TB>,
                  "this model does not take these operand types (amx_bf16, avx512_bf16: Eigen::bfloat16 x "
                  "Eigen::bfloat16; amx_fp16: Eigen::half x Eigen::half)");
}

}  // namespace detail::fma_chain

// ---------------------------------------------------------------------------------------------
// dot, gemm, gemm_dot

/// One instruction's result for one output: c + sum of a[k]*b[k] as Model's unit computes it, bit
/// for bit. a and b hold the same even number of products, 2 to Model::k (amx_bf16, amx_fp16: a
/// tile of colsb = 2 * size bytes; avx512_bf16: exactly 2); shape_error otherwise.
template <FmaChainModel Model, class TA, class TB>
[[nodiscard]] float dot(std::span<const TA> a, std::span<const TB> b, float c)
{
    detail::fma_chain::check_operands<Model, TA, TB>();
    if (a.size() != b.size() || a.size() % 2 != 0 || a.size() < 2 || a.size() > Model::k) {
        SCALIFY_THROW(shape_error(fmt::format("tensor_core::dot<{}>: spans of {} and {} elements; the instruction takes "
                                              "the same even number of each, 2 to {}",
                                              Model::name, a.size(), b.size(), Model::k)));
    }
    std::uint32_t wa[Model::k], wb[Model::k];
    for (std::size_t i = 0; i < a.size(); ++i) {
        wa[i] = detail::fma_chain::widen(a[i]);
        wb[i] = detail::fma_chain::widen(b[i]);
    }
    return std::bit_cast<float>(
        detail::fma_chain::instruction<Model>(wa, wb, a.size(), std::bit_cast<std::uint32_t>(c)));
}

/// dot over any contiguous ranges (std::array, std::vector, ...).
template <FmaChainModel Model, std::ranges::contiguous_range RA, std::ranges::contiguous_range RB>
    requires(!detail::is_const_span<std::remove_cvref_t<RA>> || !detail::is_const_span<std::remove_cvref_t<RB>>)
[[nodiscard]] float dot(const RA& a, const RB& b, float c)
{
    using TA = std::ranges::range_value_t<RA>;
    using TB = std::ranges::range_value_t<RB>;
    return dot<Model, TA, TB>(std::span<const TA>(std::ranges::data(a), std::ranges::size(a)),
                              std::span<const TB>(std::ranges::data(b), std::ranges::size(b)), c);
}

namespace detail {

/// The engine of the chained-FMA units: float lanes with the CPU's FMA (round to nearest, the
/// default environment), the exact chain for the outputs they leave unsure and under any other
/// rounding mode. Outputs are shared among OpenMP threads when the including program is built
/// with OpenMP.
template <FmaChainModel Instruction>
struct gemm_engine<Instruction> {
    template <GemmModel Model, class TA, class TB>
    static void run(const TA* a, const TB* b, std::size_t m, std::size_t k, std::size_t n, float* out)
    {
        std::vector<std::uint32_t> rows, columns;
        read_rows_and_columns<gemm_engine>(a, b, m, k, n, rows, columns);
        const std::uint32_t* const r = rows.data();
        const std::uint32_t* const c = columns.data();
        const auto exact = [=](std::size_t i, std::size_t j) { return chain<Model, TA, TB>(r + i * k, c + j * k, k); };
        // The lanes run one chain with the CPU's float FMA: only under round to nearest.
        if (Model::promotion_interval != 0 || std::fegetround() != FE_TONEAREST) {
            scalify::detail::parallel_for(m, [=](std::size_t i) {
                for (std::size_t j = 0; j < n; ++j) out[i * n + j] = exact(i, j);
            });
            return;
        }
        // Float panels, DAZ applied, K padded to even with a zero product (as chain() does): A by
        // rows, B in blocks of lane_width columns, K rows each; columns past N are zeros.
        constexpr std::size_t W = fma_chain::lane_width;
        const std::size_t kp = (k + 1) / 2 * 2, blocks = (n + W - 1) / W;
        std::vector<float> a_panel(m * kp, 0.0f), b_panel(blocks * kp * W, 0.0f);
        for (std::size_t i = 0; i < m; ++i)
            for (std::size_t p = 0; p < k; ++p) a_panel[i * kp + p] = fma_chain::lane_value(r[i * k + p]);
        for (std::size_t j = 0; j < n; ++j)
            for (std::size_t p = 0; p < k; ++p) b_panel[((j / W) * kp + p) * W + j % W] = fma_chain::lane_value(c[j * k + p]);
        const float* const ap = a_panel.data();
        const float* const bp = b_panel.data();
        const auto lanes = [=](std::size_t i, std::size_t block, float* lane_out) {
            return fma_chain::lanes<Model>(ap + i * kp, bp + block * kp * W, kp, lane_out);
        };
        lane_tasks<W>(m, n, out, lanes, exact);
    }

    /// An operand's float32 bits (bf16 or fp16 widened exactly).
    template <class T>
    [[nodiscard]] static std::uint32_t read(const T& x) noexcept
    {
        return fma_chain::widen(x);
    }

    template <GemmModel Model, class TA, class TB>
    [[nodiscard]] static float chain(const std::uint32_t* x, const std::uint32_t* y, std::size_t k) noexcept
    {
        return std::bit_cast<float>(fma_chain::chain<Model>(x, y, k));
    }
};

}  // namespace detail

}  // namespace scalify::tensor_core
