#pragma once
/// \file tensor_core/model.hpp
/// Descriptions of tensor-core arithmetic: one template, inner_product_model<F, P, K, Operands,
/// Rules, Accumulator>, describes what one matrix instruction computes for one output (the
/// accumulator plus K products), and gemm_model<Instruction, PromotionInterval> how a GEMM strings
/// the instructions of any matrix unit along K (MatrixInstruction: these, and the chained-FMA,
/// CDNA and block-scaled instructions of amx.hpp, cdna.hpp and blackwell.hpp). The measured units
/// are tags derived from them (the H100's h100_qgmma,
/// h100_hmma, h100_cublaslt_fp8, h100_cublaslt_fp8_fast; v100_hmma, a100_hmma, ada_hmma, ada_qmma,
/// b200_hmma, b200_qmma, the tf32 units a100_tf32 to b200_tf32 and the float16-accumulator units
/// *_f16acc from public captures), closed by the concepts InnerProductModel, MatrixInstruction and
/// GemmModel.
/// docs/tensor_core.md states the rules and how they were measured.
///
///     struct my_unit : inner_product_model<10, 12, 64, any_pair_of<float8_e4m3fn>> {
///         static constexpr const char* name = "my_unit";
///     };

#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/minifloat.hpp>
#include <scalify/numeric/policies.hpp>

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace scalify::tensor_core {

// ---------------------------------------------------------------------------------------------
// Rules

/// Which exponent a product a*b brings to the alignment.
enum class product_exponent {
    nominal,    ///< ea + eb, each operand's own exponent (1 - bias for a subnormal); the product is
                ///< not renormalised, so a product of two normals lies in [1, 4) * 2^(ea + eb) (H100)
    normalised  ///< floor(log2 |a*b|), as if the product were renormalised first
};

/// The rules an inner_product_model is built from, besides F, P and K.
/// \tparam Alignment how terms are cut to a multiple of 2^(emax - F)
/// \tparam Normalisation how the exact sum is cut to P significant bits
template <product_exponent Exponent = product_exponent::nominal, rounding_mode Alignment = rounding_mode::toward_zero,
          rounding_mode Normalisation = rounding_mode::toward_zero>
struct inner_product_rules {
    static_assert(Alignment != rounding_mode::stochastic && Normalisation != rounding_mode::stochastic,
                  "tensor-core models cut toward zero or round to nearest even; stochastic rounding is not modelled");
    static constexpr product_exponent exponent = Exponent;
    static constexpr rounding_mode alignment = Alignment;
    static constexpr rounding_mode normalisation = Normalisation;
};

/// What the H100's QGMMA and HMMA do (measured): nominal product exponents, every cut toward zero.
using h100_rules = inner_product_rules<>;

// ---------------------------------------------------------------------------------------------
// Operand sets

namespace detail {
template <class T, class... Ts>
inline constexpr bool one_of = (std::same_as<T, Ts> || ...);

/// Bits of an element type's significand, implicit bit included.
template <EncodedFloat T>
inline constexpr int significand_bits = float_traits<T>::format::mantissa_bits + 1;
}  // namespace detail

/// Operands: a from Ts, b from Ts, in any combination (QGMMA takes e4m3 x e5m2 as well).
template <EncodedFloat... Ts>
struct any_pair_of {
    template <class A, class B>
    static constexpr bool contains = detail::one_of<A, Ts...> && detail::one_of<B, Ts...>;
};

/// Operands: a and b of the same type, one of Ts (HMMA multiplies f16 by f16 or bf16 by bf16).
template <EncodedFloat... Ts>
struct same_type_of {
    template <class A, class B>
    static constexpr bool contains = std::same_as<A, B> && detail::one_of<A, Ts...>;
};

/// How a tf32 unit reads a float32 operand (tf32: 1 sign, 8 exponent, 10 mantissa bits).
enum class tf32_input {
    truncate,     ///< the low 13 mantissa bits are dropped (MMA-Sim's truncate_to_tf32)
    nearest_even  ///< rounded to the nearest tf32, ties to even (as cvt.rn.tf32.f32 would)
};

/// Operands: float x float, each read as a tf32 value as Input says (the tf32 units). A NaN
/// stays NaN and an infinity infinite; a finite float may round to a tf32 infinity under
/// nearest_even. The public captures hold tf32 values only (low 13 bits zero), on which both
/// readings agree.
template <tf32_input Input = tf32_input::truncate>
struct tf32_operands {
    static constexpr tf32_input input = Input;
    template <class A, class B>
    static constexpr bool contains = std::same_as<A, float> && std::same_as<B, float>;
};

namespace detail {
template <class Operands>
inline constexpr bool reads_tf32 = false;
template <tf32_input Input>
inline constexpr bool reads_tf32<tf32_operands<Input>> = true;

/// What an accumulator type may be: float32 (every GEMM) or float16 (Eigen::half: the
/// float16-accumulator instructions, one at a time through dot).
template <class T>
inline constexpr bool accumulator_type = std::same_as<T, float> || std::same_as<T, Eigen::half>;
/// Significant bits of an accumulator type.
template <class T>
inline constexpr int accumulator_bits = std::same_as<T, float> ? 24 : 11;
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// One instruction

/// What every instruction of K products over an operand set provides to a GEMM (MatrixInstruction,
/// below): the family templates derive from it (inner_product_model here, fma_chain_model and
/// block_scaled_model in amx.hpp and blackwell.hpp).
/// \tparam ScaleBlock elements per block scale along K (0: the operands carry no scales)
template <class Operands, std::size_t K, class Accumulator = float, std::size_t ScaleBlock = 0>
struct instruction_of {
    static constexpr std::size_t k = K;
    using operands = Operands;
    using accumulator = Accumulator;
    static constexpr std::size_t scale_block = ScaleBlock;
    /// Whether the instruction multiplies an A of type TA by a B of type TB.
    template <class TA, class TB>
    static constexpr bool takes = Operands::template contains<TA, TB>;
    /// Products per instruction for operands TA x TB: K for every pair.
    template <class TA, class TB>
    static constexpr std::size_t k_for = K;
};

/// One matrix instruction, as seen by one output: D = C + sum of K products a[k]*b[k].
/// Every product is exact; the accumulator C and the products are aligned to the largest
/// exponent emax among them, cut to a multiple of 2^(emax - F), summed exactly, and the sum is
/// cut to P significant bits (Rules say how each cut rounds and which exponent a product has) in
/// the accumulator's format. Zero products and a zero C take no part in the alignment.
/// \tparam AlignmentBits F: bits kept below emax
/// \tparam ResultBits P: significant bits of the result (at most the accumulator's: 24 for
///         float32, 11 for float16)
/// \tparam K products per instruction (and per call of dot)
/// \tparam Operands an operand set (any_pair_of, same_type_of, tf32_operands) naming the element
///         types
/// \tparam Accumulator C's and D's type: float (float32) or Eigen::half (float16; such a model
///         runs through dot only, not in GEMMs)
template <int AlignmentBits, int ResultBits, std::size_t K, class Operands, class Rules = h100_rules,
          class Accumulator = float>
struct inner_product_model : instruction_of<Operands, K, Accumulator> {
    static_assert(detail::accumulator_type<Accumulator>, "the accumulator is float (float32) or Eigen::half (float16)");
    static_assert(AlignmentBits >= 0 && AlignmentBits <= 40, "F (AlignmentBits) must lie in [0, 40]");
    static_assert(ResultBits >= 1 && ResultBits <= detail::accumulator_bits<Accumulator>,
                  "P (ResultBits) must lie in [1, 24] for a float32 result, [1, 11] for a float16 one");
    static_assert(K >= 1 && K <= 4096, "K must lie in [1, 4096]");
    static constexpr int alignment_bits = AlignmentBits;
    static constexpr int result_bits = ResultBits;
    using rules = Rules;
};

/// A tag describing one instruction: derived from inner_product_model, with a name.
template <class M>
concept InnerProductModel =
    std::is_base_of_v<inner_product_model<M::alignment_bits, M::result_bits, M::k, typename M::operands, typename M::rules,
                                          typename M::accumulator>,
                      M> &&
    requires {
        { M::name } -> std::convertible_to<const char*>;
    };

/// An instruction model whose operands may be TA (for A) and TB (for B).
template <class M, class TA, class TB>
concept InnerProductModelFor = InnerProductModel<M> && M::template takes<TA, TB>;

/// H100 SXM `wgmma.mma_async...f32.{e4m3,e5m2}.{e4m3,e5m2}` (SASS QGMMA), K = 32, float32
/// accumulator: F = 13, P = 14. An fp8 accumulation never keeps more than 14 significant bits,
/// the accumulator included. The same arithmetic as fp8 `mma.sync.m16n8k32`.
struct h100_qgmma : inner_product_model<13, 14, 32, any_pair_of<float8_e4m3fn, float8_e5m2>> {
    static constexpr const char* name = "h100_qgmma";
};

/// H100 SXM `mma.sync.m16n8k16.f32.{f16,bf16}` (SASS HMMA.16816.F32), K = 16, float32
/// accumulator: F = 25, P = 24.
struct h100_hmma : inner_product_model<25, 24, 16, same_type_of<Eigen::half, Eigen::bfloat16>> {
    static constexpr const char* name = "h100_hmma";
};

/// The H200 runs the H100's units: its public capture (Khattak and Mikaitis) matches h100_hmma
/// and h100_qgmma on every vector.
using h200_hmma = h100_hmma;
using h200_qgmma = h100_qgmma;

// ---------------------------------------------------------------------------------------------
// Other NVIDIA units with a float32 accumulator, from the public captures of Khattak and
// Mikaitis ("Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004) and the parameters of
// MMA-Sim (Xie et al., arXiv 2511.10909). K is the fused adder's block: an instruction with a
// longer K (mma.sync.m16n8k16 on the A100, m16n8k32 fp8 on Ada) runs several blocks in a chain,
// each block's result the next one's accumulator (gemm_model chains them). docs/tensor_core.md
// has the match counts.

/// V100 (Volta) f16 HMMA with a float32 accumulator (wmma, `mma.sync.m8n8k4`): blocks of K = 4
/// products, F = 23, P = 24, every cut toward zero.
struct v100_hmma : inner_product_model<23, 24, 4, same_type_of<Eigen::half>> {
    static constexpr const char* name = "v100_hmma";
};

/// A100 (Ampere) f16/bf16 HMMA with a float32 accumulator (wmma, `mma.sync.m16n8k16`, SASS
/// HMMA.16816.F32): blocks of K = 8 (two per m16n8k16), F = 24, P = 24, every cut toward zero.
/// The A2's capture matches it on every vector; the A30 (whose published MATLAB model is the
/// A100's) and the RTX 30 series (MMA-Sim's Ampere, F = 24) are not in the capture.
struct a100_hmma : inner_product_model<24, 24, 8, same_type_of<Eigen::half, Eigen::bfloat16>> {
    static constexpr const char* name = "a100_hmma";
};
using a2_hmma = a100_hmma;

/// Ada (RTX 40, RTX Ada, L40S) f16/bf16 HMMA with a float32 accumulator: the A100's arithmetic,
/// blocks of K = 8, F = 24, P = 24, every cut toward zero.
struct ada_hmma : inner_product_model<24, 24, 8, same_type_of<Eigen::half, Eigen::bfloat16>> {
    static constexpr const char* name = "ada_hmma";
};

/// Ada (RTX 40, RTX Ada, L40S) `mma.sync.m16n8k32.f32.{e4m3,e5m2}.{e4m3,e5m2}` (SASS QMMA): two
/// blocks of K = 16, F = 13, P = 14 (the H100's QGMMA rule on half its K), every cut toward zero.
struct ada_qmma : inner_product_model<13, 14, 16, any_pair_of<float8_e4m3fn, float8_e5m2>> {
    static constexpr const char* name = "ada_qmma";
};

/// B200 (Blackwell, sm_100) f16/bf16 HMMA with a float32 accumulator (wmma, `mma.sync`): the
/// H100's rule, K = 16, F = 25, P = 24, every cut toward zero.
struct b200_hmma : inner_product_model<25, 24, 16, same_type_of<Eigen::half, Eigen::bfloat16>> {
    static constexpr const char* name = "b200_hmma";
};

/// Rounds the sum to nearest even (B200 fp8): nominal exponents, terms cut toward zero, the sum
/// rounded to nearest, ties to even.
using nearest_result_rules =
    inner_product_rules<product_exponent::nominal, rounding_mode::toward_zero, rounding_mode::nearest_even>;

/// B200 (Blackwell, sm_100) `mma.sync.m16n8k32.f32.{e4m3,e5m2}.{e4m3,e5m2}`: one block of K = 32
/// whose sum is rounded to nearest even (not cut toward zero: MMA-Sim's F = 25, P = 24 rule with
/// cuts toward zero, published for tcgen05 kind::f8f6f4, misses about a third of this capture).
/// The capture bounds F from below only (F >= 30 reproduces every vector, F = 29 misses one
/// E5M2 vector); F = 40, the largest the template takes, makes the result the correctly rounded
/// float32 of C + sum a*b whenever no term has bits below 2^(emax - 40). The capture went through
/// mma.sync; tcgen05.mma kind::f8f6f4 was not captured.
struct b200_qmma : inner_product_model<40, 24, 32, any_pair_of<float8_e4m3fn, float8_e5m2>, nearest_result_rules> {
    static constexpr const char* name = "b200_qmma";
};

// ---------------------------------------------------------------------------------------------
// tf32 units: float operands read as tf32 (1-8-10), float32 accumulator, every cut toward zero.
// The capture's tf32 lines hold 4 products each, one block of the Ampere and Ada units; K of the
// Hopper and Blackwell units (8) is the published models' (MMA-Sim: no split of m16n8k8 tf32 on
// Hopper; the MATLAB H100TC.m and B200TC.m: fma 8), not something the capture can tell.

/// A100 (Ampere: A100, A30, A2, RTX 30) tf32 `mma.sync.m16n8k8` (and wmma m16n16k8): blocks of
/// K = 4 (two per m16n8k8), F = 24, P = 24, operands truncated to tf32. The A2's capture matches
/// it on every vector.
struct a100_tf32 : inner_product_model<24, 24, 4, tf32_operands<>> {
    static constexpr const char* name = "a100_tf32";
};
using a2_tf32 = a100_tf32;

/// Ada (RTX 40, RTX Ada, L40S) tf32: the A100's arithmetic, blocks of K = 4, F = 24, P = 24.
struct ada_tf32 : inner_product_model<24, 24, 4, tf32_operands<>> {
    static constexpr const char* name = "ada_tf32";
};

/// H100, H200 tf32 (`mma.sync.m16n8k8`, `wgmma` tf32): blocks of K = 8, F = 25, P = 24.
struct h100_tf32 : inner_product_model<25, 24, 8, tf32_operands<>> {
    static constexpr const char* name = "h100_tf32";
};
using h200_tf32 = h100_tf32;

/// B200 (sm_100) tf32: the H100's rule, blocks of K = 8, F = 25, P = 24.
struct b200_tf32 : inner_product_model<25, 24, 8, tf32_operands<>> {
    static constexpr const char* name = "b200_tf32";
};

// ---------------------------------------------------------------------------------------------
// float16 accumulators (`mma.sync ... .f16 ... .f16`, wmma with a half accumulator): C and D are
// float16. The unit aligns and sums exactly as its float32 form (same F and K; C joins with its
// float16 value) and rounds the exact sum once to the nearest float16, ties to even (subnormals
// on the 2^-24 grid, overflow to inf): MMA-Sim's f16 output and the MATLAB models' frmode 'rne'.
// A block's float16 result is the next block's C. bf16 and tf32 instructions have no float16
// accumulator. dot<Model>(a, b, Eigen::half c) returns Eigen::half; GEMM chains take float32
// accumulators only.

/// V100 f16 HMMA with a float16 accumulator: K = 4, F = 23 (v100_hmma's), rounded to nearest.
struct v100_hmma_f16acc : inner_product_model<23, 11, 4, same_type_of<Eigen::half>, nearest_result_rules, Eigen::half> {
    static constexpr const char* name = "v100_hmma_f16acc";
};
/// A100 (A2, A30, RTX 30) f16 HMMA with a float16 accumulator: K = 8, F = 24.
struct a100_hmma_f16acc : inner_product_model<24, 11, 8, same_type_of<Eigen::half>, nearest_result_rules, Eigen::half> {
    static constexpr const char* name = "a100_hmma_f16acc";
};
using a2_hmma_f16acc = a100_hmma_f16acc;
/// Ada (RTX 40, L40S) f16 HMMA with a float16 accumulator: K = 8, F = 24.
struct ada_hmma_f16acc : inner_product_model<24, 11, 8, same_type_of<Eigen::half>, nearest_result_rules, Eigen::half> {
    static constexpr const char* name = "ada_hmma_f16acc";
};
/// Ada `mma.sync.m16n8k32.f16.{e4m3,e5m2}.{e4m3,e5m2}.f16`: two blocks of K = 16, F = 13, each
/// rounded to the nearest float16 (no 14-bit cut: the float32 form's P does not apply).
struct ada_qmma_f16acc
    : inner_product_model<13, 11, 16, any_pair_of<float8_e4m3fn, float8_e5m2>, nearest_result_rules, Eigen::half> {
    static constexpr const char* name = "ada_qmma_f16acc";
};
/// H100, H200 f16 HMMA with a float16 accumulator: K = 16, F = 25.
struct h100_hmma_f16acc : inner_product_model<25, 11, 16, same_type_of<Eigen::half>, nearest_result_rules, Eigen::half> {
    static constexpr const char* name = "h100_hmma_f16acc";
};
using h200_hmma_f16acc = h100_hmma_f16acc;
/// B200 f16 HMMA with a float16 accumulator: K = 16, F = 25.
struct b200_hmma_f16acc : inner_product_model<25, 11, 16, same_type_of<Eigen::half>, nearest_result_rules, Eigen::half> {
    static constexpr const char* name = "b200_hmma_f16acc";
};
// The fp8 units of the H100, H200 and B200 with a float16 accumulator have no model: no rule
// tried reproduces their capture (docs/tensor_core.md, "What is not known to match").

// ---------------------------------------------------------------------------------------------
// A GEMM: instructions chained along K

/// What a GEMM needs of a matrix instruction, whatever its arithmetic: a name; the operand pairs
/// it takes (`takes<TA, TB>`); how many products one instruction consumes for a pair
/// (`k_for<TA, TB>`, with `k` the largest); its accumulator (`accumulator`: C and D, float32 for
/// every unit a GEMM chains); and its block scales (`scale_block`: elements per scale along K, 0
/// for none). How one instruction turns C and its products into D is its family's engine (the
/// tags of inner_product_model here; fma_chain_model in amx.hpp, cdna_mfma_model in cdna.hpp,
/// block_scaled_model in blackwell.hpp).
template <class M>
concept MatrixInstruction = requires {
    { M::name } -> std::convertible_to<const char*>;
    { M::template takes<float, float> } -> std::convertible_to<bool>;
    { M::template k_for<float, float> } -> std::convertible_to<std::size_t>;
    { M::k } -> std::convertible_to<std::size_t>;
    { M::scale_block } -> std::convertible_to<std::size_t>;
    typename M::accumulator;
};

/// How a GEMM consumes K: Instruction::k_for<TA, TB> products at a time in increasing k, each
/// instruction's result the next one's accumulator (a chain) from C = +0. With
/// PromotionInterval = n > 0 the chain restarts from 0 every n instructions and each partial sum is
/// added to a float32 total with a round-to-nearest-even add; with 0 one chain runs over all of K.
/// A K that is not a multiple of the instruction's ends with a shorter instruction, zero-padded
/// (zero products take no part, or count as the unit's rule says). The one GEMM template of every
/// unit: fma_gemm_model, cdna_gemm_model and block_gemm_model are its one-chain aliases.
template <MatrixInstruction Instruction, std::size_t PromotionInterval = 0>
struct gemm_model {
    static_assert(std::same_as<typename Instruction::accumulator, float>,
                  "a GEMM chains float32 accumulators: float16-accumulator instructions run through dot only");
    using instruction = Instruction;
    static constexpr std::size_t promotion_interval = PromotionInterval;
};

/// A tag describing a GEMM: derived from gemm_model, with a name.
template <class M>
concept GemmModel = MatrixInstruction<typename M::instruction> &&
                    std::is_base_of_v<gemm_model<typename M::instruction, M::promotion_interval>, M> && requires {
                        { M::name } -> std::convertible_to<const char*>;
                    };

/// A GEMM model whose instruction takes TA x TB.
template <class M, class TA, class TB>
concept GemmModelFor = GemmModel<M> && M::instruction::template takes<TA, TB>;

/// cuBLASLt's FP8 GEMM on the H100 with its default accumulation (torch._scaled_mm,
/// use_fast_accum=False): QGMMA chains of 4 instructions (128 of K), each partial added to a
/// float32 total, as DeepSeek-V3's promotion every 128 terms.
struct h100_cublaslt_fp8 : gemm_model<h100_qgmma, 4> {
    static constexpr const char* name = "h100_cublaslt_fp8";
};

/// cuBLASLt's FP8 GEMM with use_fast_accum=True: one QGMMA chain over all of K, so every
/// partial sum keeps at most 14 significant bits.
struct h100_cublaslt_fp8_fast : gemm_model<h100_qgmma, 0> {
    static constexpr const char* name = "h100_cublaslt_fp8_fast";
};

/// A 16-bit GEMM on the H100's HMMA: one chain over all of K (what a kernel that keeps its
/// float32 accumulators in registers does). Not captured through cuBLAS; the instruction is.
struct h100_hmma_chain : gemm_model<h100_hmma, 0> {
    static constexpr const char* name = "h100_hmma_chain";
};

// One chain over all of K on each of the other units (what a kernel that keeps its float32
// accumulators in registers does, as h100_hmma_chain). The instructions are captured; no GEMM
// library's order of chains on these GPUs is.

/// f16 GEMM on the V100's HMMA, one chain.
struct v100_hmma_chain : gemm_model<v100_hmma, 0> {
    static constexpr const char* name = "v100_hmma_chain";
};
/// f16/bf16 GEMM on the A100's (and A2's) HMMA, one chain.
struct a100_hmma_chain : gemm_model<a100_hmma, 0> {
    static constexpr const char* name = "a100_hmma_chain";
};
/// f16/bf16 GEMM on Ada's HMMA (RTX 40, L40S), one chain.
struct ada_hmma_chain : gemm_model<ada_hmma, 0> {
    static constexpr const char* name = "ada_hmma_chain";
};
/// fp8 GEMM on Ada's QMMA (RTX 40, L40S), one chain: every partial sum keeps at most 14
/// significant bits, as the H100's fast accumulation.
struct ada_qmma_chain : gemm_model<ada_qmma, 0> {
    static constexpr const char* name = "ada_qmma_chain";
};
/// f16/bf16 GEMM on the B200's HMMA, one chain.
struct b200_hmma_chain : gemm_model<b200_hmma, 0> {
    static constexpr const char* name = "b200_hmma_chain";
};
/// fp8 GEMM on the B200's mma.sync fp8 unit, one chain: each 32 products and the running sum
/// rounded once to nearest even.
struct b200_qmma_chain : gemm_model<b200_qmma, 0> {
    static constexpr const char* name = "b200_qmma_chain";
};
/// tf32 GEMM of float operands (read as tf32) on the A100's (A2's, RTX 30's) unit, one chain.
struct a100_tf32_chain : gemm_model<a100_tf32, 0> {
    static constexpr const char* name = "a100_tf32_chain";
};
/// tf32 GEMM on Ada's unit (RTX 40, L40S), one chain.
struct ada_tf32_chain : gemm_model<ada_tf32, 0> {
    static constexpr const char* name = "ada_tf32_chain";
};
/// tf32 GEMM on the H100's (H200's) unit, one chain.
struct h100_tf32_chain : gemm_model<h100_tf32, 0> {
    static constexpr const char* name = "h100_tf32_chain";
};
/// tf32 GEMM on the B200's unit, one chain.
struct b200_tf32_chain : gemm_model<b200_tf32, 0> {
    static constexpr const char* name = "b200_tf32_chain";
};

}  // namespace scalify::tensor_core
