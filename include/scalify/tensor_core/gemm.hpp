#pragma once
/// \file tensor_core/gemm.hpp
/// gemm<Model>(a, b): an (M x K) . (K x N) product as a GPU GEMM computes it, bit for bit: each
/// output a chain of Model::instruction along K (tensor_core/model.hpp says how chains are cut
/// and promoted). gemm_dot<Model>(a, b) is one output of it for vectors of any length. One
/// gemm_model template, one chain along K (detail::chain_along_k) and these entry points serve
/// every unit; what differs per family of instructions is its engine (detail::gemm_engine: the
/// arithmetic of one instruction and its fast lanes), here for inner_product_model, in amx.hpp,
/// cdna.hpp and blackwell.hpp for the others.
///
///     xt::xarray<float8_e4m3fn> a = ...;  // M x K
///     xt::xarray<float8_e4m3fn> b = ...;  // K x N
///     xt::xarray<float> d = tensor_core::gemm<tensor_core::h100_cublaslt_fp8>(a, b);
///
/// Speed: under the H100 rules (fp8 pairs, f16, and bf16 or tf32 data whose exponents keep every
/// result in float32's normal range), each aligned term is trunc(a * b * 2^(F - emax)), exact in float
/// lanes, summed in int32 lanes (runs of them in int64 where K terms need more than 31 bits, as
/// b200_f8f6f4's do): every step runs across 32 outputs of two rows at once (two chains side by
/// side, so that a short instruction does not wait on the one before) in plain float and
/// int32 vector code (SSE2, AVX2 and AVX-512 alike); outputs are shared among OpenMP threads when
/// the including program is compiled with OpenMP (as Eigen's GEMM does), otherwise one thread.
/// Everything else (other rules, bf16 or tf32 data out of that range, the outputs a NaN or inf code
/// reaches) runs the reference engine of dot.hpp per output.
/// M, N or K of 0: an M x N result, all +0 when K = 0.

#include <scalify/detail/parallel.hpp>
#include <scalify/error.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/tensor_core/dot.hpp>
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
#include <cstdlib>
#include <cstring>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace scalify::tensor_core {

namespace detail {

/// The chain along K of every GEMM model, for one output: instructions of `step` products in
/// increasing k, each consuming the running accumulator (`instruction(first, count, c)` returns
/// D for products [first, first + count), count < step only for the last one), from C = c. With
/// Interval = n > 0 the chain restarts from +0 every n instructions and each partial sum joins a
/// float32 total by a round-to-nearest-even add (promotion; c is then +0).
template <std::size_t Interval, class Instruction>
[[nodiscard]] float chain_along_k(std::size_t k, std::size_t step, const Instruction& instruction, float c = 0.0f)
{
    float total = 0.0f;
    float partial = c;
    std::size_t in_group = 0;
    for (std::size_t s = 0; s < k; s += step) {
        partial = instruction(s, std::min(step, k - s), partial);
        if (Interval != 0 && ++in_group == Interval) {
            total += partial;  // round to nearest even, as the promotion's float32 add
            partial = 0.0f;
            in_group = 0;
        }
    }
    if constexpr (Interval == 0) return partial;
    else return in_group != 0 ? total + partial : total;
}

/// How the GEMMs of one family of instructions run, specialised per family (InnerProductModel
/// here; FmaChainModel and CdnaModel in their headers; block-scaled GEMMs take their scales
/// through block_gemm, blackwell.hpp). An engine E provides, for M, N, K > 0 and operands
/// row-major and contiguous:
///   E::run<Model>(a, b, m, k, n, out)                 the GEMM (its lanes, the chains where they stop)
///   E::read(x), E::chain<Model, TA, TB>(x, y, k)      an operand as the unit reads it, and one output
///                                                     over k operands so read (gemm_dot);
///                                                     or E::one<Model>(a, b, k) for both
///   E::run_on_grid<Model, TA, TB>(a, b, ...)          optional: the GEMM over float32 values on TA's
///                                                     and TB's grids (else they are stored as TA, TB)
template <class Instruction>
struct gemm_engine;

/// A by rows and B by columns, each operand as Engine reads it, so that each output reads two
/// contiguous runs: rows (M x K) and columns (N x K).
template <class Engine, class TA, class TB, class Element>
void read_rows_and_columns(const TA* a, const TB* b, std::size_t m, std::size_t k, std::size_t n,
                           std::vector<Element>& rows, std::vector<Element>& columns)
{
    rows.resize(m * k);
    columns.resize(n * k);
    for (std::size_t i = 0; i < m * k; ++i) rows[i] = Engine::read(a[i]);
    for (std::size_t p = 0; p < k; ++p)
        for (std::size_t j = 0; j < n; ++j) columns[j * k + p] = Engine::read(b[p * n + j]);
}

/// One output of Model's GEMM over a[0..k) and b[0..k): gemm_dot's.
template <GemmModel Model, class TA, class TB>
[[nodiscard]] float gemm_output(const TA* a, const TB* b, std::size_t k)
{
    using engine = gemm_engine<typename Model::instruction>;
    if constexpr (requires { engine::template one<Model>(a, b, k); }) {
        return engine::template one<Model>(a, b, k);
    } else {
        std::vector<decltype(engine::read(*a))> x(k), y(k);
        for (std::size_t i = 0; i < k; ++i) {
            x[i] = engine::read(a[i]);
            y[i] = engine::read(b[i]);
        }
        return engine::template chain<Model, TA, TB>(x.data(), y.data(), k);
    }
}

/// Model's GEMM over float32 operands on the grids of TA and TB, by storing them as TA and TB
/// first (exact: the values are on the grids): the engines without a reader of their own for such
/// operands.
template <GemmModel Model, class TA, class TB>
void gemm_on_grid_as_stored(const float* a, const float* b, std::size_t m, std::size_t k, std::size_t n, float* out)
{
    std::vector<TA> ta(m * k);
    std::vector<TB> tb(k * n);
    for (std::size_t i = 0; i < ta.size(); ++i) ta[i] = TA(a[i]);
    for (std::size_t i = 0; i < tb.size(); ++i) tb[i] = TB(b[i]);
    gemm_engine<typename Model::instruction>::template run<Model>(ta.data(), tb.data(), m, k, n, out);
}

/// The lanes' skeleton of the engines whose lanes may leave outputs unsure: tasks of one row of A
/// by one block of W columns, shared among threads; lanes(i, block, lane_out) computes W outputs
/// and returns a mask of those to take from exact(i, j) instead. Consecutive tasks take the rows
/// of one block in turn, so that block's panel (K rows of W) stays in cache.
template <std::size_t W, class Lanes, class Exact>
void lane_tasks(std::size_t m, std::size_t n, float* out, const Lanes& lanes, const Exact& exact)
{
    const std::size_t blocks = (n + W - 1) / W;
    scalify::detail::parallel_for(m * blocks, [=, &lanes, &exact](std::size_t task) {
        const std::size_t i = task % m, block = task / m, j0 = block * W, width = std::min(W, n - j0);
        float lane_out[W];
        const std::uint32_t unsure = lanes(i, block, lane_out);
        for (std::size_t j = 0; j < width; ++j) out[i * n + j0 + j] = (unsure >> j) & 1u ? exact(i, j0 + j) : lane_out[j];
    });
}

/// One output of Model's GEMM: a[0..k) . b[0..k), decomposed.
template <GemmModel Model>
[[nodiscard]] float chain_reference(const operand* a, const operand* b, std::size_t k) noexcept
{
    using instruction = typename Model::instruction;
    return chain_along_k<Model::promotion_interval>(k, instruction::k, [=](std::size_t s, std::size_t count, float c) {
        return inner_product<instruction>(a + s, b + s, count, c);
    });
}

/// One output's chain of one model (chain_reference<Model>), as a value.
using chain_fn = float (*)(const operand* a, const operand* b, std::size_t k) noexcept;

/// The reference engine's GEMM, out (M x N) from a (M x K) and b (K x N), row-major, each output
/// by `chain`. Tasks of 8 rows by 32 columns decompose their operands once and share them among
/// 256 outputs. Compiled once for every model (a template only so that scalify::compiled can hold
/// its one instance): the chain, called once per output of K products, is the model's own code.
template <class = void>
void gemm_reference_with(chain_fn chain, operand_source a, operand_source b, std::size_t m, std::size_t k, std::size_t n,
                         float* out)
{
    constexpr std::size_t rows = 8, columns = 32;
    const std::size_t row_tasks = (m + rows - 1) / rows, column_tasks = (n + columns - 1) / columns;
    scalify::detail::parallel_for(row_tasks * column_tasks, [&](std::size_t task) {
        const std::size_t i0 = (task / column_tasks) * rows, j0 = (task % column_tasks) * columns;
        const std::size_t height = std::min(rows, m - i0), width = std::min(columns, n - j0);
        thread_local std::vector<operand> a_rows, b_columns;
        a_rows.resize(height * k);
        b_columns.resize(width * k);
        a(i0 * k, height * k, 1, a_rows.data());
        for (std::size_t j = 0; j < width; ++j) b(j0 + j, k, n, b_columns.data() + j * k);
        for (std::size_t i = 0; i < height; ++i)
            for (std::size_t j = 0; j < width; ++j)
                out[(i0 + i) * n + j0 + j] = chain(a_rows.data() + i * k, b_columns.data() + j * k, k);
    });
}

/// Model's GEMM on the reference engine.
template <GemmModel Model>
void gemm_reference(operand_source a, operand_source b, std::size_t m, std::size_t k, std::size_t n, float* out)
{
    gemm_reference_with(&chain_reference<Model>, a, b, m, k, n, out);
}

// ---- the vectorised path ----------------------------------------------------------------------

template <EncodedFloat T>
using format_of = typename float_traits<T>::format;

/// Nominal exponent of the smallest nonzero value (a subnormal, or the smallest normal).
template <FloatFormat Format>
inline constexpr int min_exponent = (Format::has_zero ? 1 : 0) - Format::bias;
/// Nominal exponent of the largest finite value.
template <FloatFormat Format>
inline constexpr int max_exponent = static_cast<int>(Format::max_magnitude >> Format::mantissa_bits) - Format::bias;

/// What the lanes need of an operand type as a unit's operand set reads it: mantissa bits, and
/// the nominal exponents of the smallest nonzero and the largest finite value.
template <class Operands, class T>
struct lane_format {
    using format = format_of<T>;
    static constexpr int mantissa_bits = format::mantissa_bits;
    static constexpr int smallest_exponent = min_exponent<format>;
    static constexpr int largest_exponent = max_exponent<format>;
};
/// float read as tf32: 10 mantissa bits, float32's exponent range.
template <tf32_input Input>
struct lane_format<tf32_operands<Input>, float> {
    static constexpr int mantissa_bits = 10;
    static constexpr int smallest_exponent = -126;
    static constexpr int largest_exponent = 127;
};

/// Exponent of a zero operand or accumulator in the lanes: every sum with it lies below any real
/// exponent.
inline constexpr std::int16_t lane_zero_exponent = -4096;

#if defined(__AVX512DQ__)
/// The lanes' exact sums of whole numbers past int32 (b200_f8f6f4's runs, the block-scaled chains):
/// int64, which AVX-512DQ converts from float and to double in vector lanes (vcvttps2qq,
/// vcvtqq2pd); lane_whole(x) is x cut toward zero.
using lane_exact_sum = std::int64_t;
[[nodiscard, gnu::always_inline]] inline lane_exact_sum lane_whole(float x) noexcept
{
    return static_cast<std::int64_t>(x);
}
#else
/// Without those conversions (SSE2, AVX2, NEON) in double: every term and every partial sum is a
/// whole number below 2^53, so exact, and each term is cut toward zero with trunc in float (exact;
/// a float of 2^23 or more is whole already): the same values. With int64 GCC left these steps
/// scalar (b200_f8f6f4 51x Eigen's GEMM at -march=x86-64-v3).
using lane_exact_sum = double;
[[nodiscard, gnu::always_inline]] inline lane_exact_sum lane_whole(float x) noexcept
{
    return static_cast<double>(std::trunc(x));
}
#endif

/// lane_plan::in_range for alignment_bits F.
[[nodiscard]] constexpr bool lanes_in_range(int F, int min_a, int max_a, int min_b, int max_b, std::size_t k) noexcept
{
    return min_a > -126 && min_b > -126 && min_a + min_b >= F - 126 &&
           max_a + max_b + 2 + static_cast<int>(std::bit_width(k)) <= 126;
}

/// Rows of A whose chains run side by side (lane_steps) for instructions of k products. Two up to
/// K = 16: one leaves K = 4 and 8 waiting on each step's result (2-3x slower), and K = 16 10-20 %
/// slower; four spill (AVX-512 Xeon). One for K = 32, whose step is long enough to keep the vector
/// units busy alone: 5-10 % faster than two (Zen 5, -O3 -march=native and -O2 SSE2) in half the
/// code.
[[nodiscard]] constexpr std::size_t lane_rows_for(std::size_t k) noexcept { return k >= 32 ? 1 : 2; }

/// What lane_steps compiles for an instruction (lane_plan<Instruction>::steps): lane_plan's
/// choices, without F wherever the steps need it only as a value (the scale's exponent and the
/// floor), so that instructions that differ in F alone share one compiled copy of the steps (V100's
/// HMMA and A100's tf32 step, K = 4; A100's HMMA and H100's tf32 step, K = 8).
struct lane_steps_plan {
    std::size_t K;                   ///< products per instruction
    int P;                           ///< result bits
    bool nearest_even;               ///< the normalisation rounds to nearest even (else toward zero)
    bool wide_double;                ///< the exact sum needs double (else float)
    bool double_terms;
    bool sum_in_int32;
    std::size_t int32_run;           ///< terms per int32 run where !sum_in_int32 (else 0)
    bool join_in_int32;
    bool float_normalisation;
    std::uint32_t accumulator_mask;
    int split_bits;                  ///< double_terms only (else 0)
    std::size_t rows;
    bool floorless_steps;
    friend constexpr bool operator==(const lane_steps_plan&, const lane_steps_plan&) = default;
};

/// The types and masks lane_steps computes in, from its plan (lane_plan documents each).
template <lane_steps_plan S>
struct lane_arithmetic {
    static constexpr std::size_t K = S.K;
    static constexpr int P = S.P;
    static constexpr bool double_terms = S.double_terms;
    static constexpr bool sum_in_int32 = S.sum_in_int32;
    static constexpr std::size_t int32_run = S.int32_run;
    static constexpr bool join_in_int32 = S.join_in_int32;
    static constexpr bool float_normalisation = S.float_normalisation;
    static constexpr std::uint32_t accumulator_mask = S.accumulator_mask;
    static constexpr std::size_t rows = S.rows;
    static constexpr bool floorless_steps = S.floorless_steps;
    using wide = std::conditional_t<S.wide_double, double, float>;
    using wide_bits = std::conditional_t<S.wide_double, std::uint64_t, std::uint32_t>;
    static constexpr int wide_mantissa = S.wide_double ? 52 : 23;
    static constexpr wide_bits result_mask = ~((wide_bits{1} << (wide_mantissa + 1 - P)) - 1);
    static constexpr std::uint32_t float_result_mask = ~((std::uint32_t{1} << (24 - std::min(P, 24))) - 1);
    static constexpr int split_bits = S.split_bits;
    static constexpr float split_down = 1.0f / static_cast<float>(std::uint64_t{1} << split_bits);
    static constexpr float split_up = static_cast<float>(std::uint64_t{1} << split_bits);
    static constexpr double split_unit = static_cast<double>(std::uint64_t{1} << split_bits);
    [[nodiscard]] static std::int32_t split_high(float x) noexcept { return static_cast<std::int32_t>(x * split_down); }
    [[nodiscard]] static std::int32_t split_low(float x, std::int32_t high) noexcept
    {
        return static_cast<std::int32_t>(x - static_cast<float>(high) * split_up);
    }
    using lane_sum = std::conditional_t<double_terms, double, std::conditional_t<sum_in_int32, std::int32_t, lane_exact_sum>>;
    using c_term = std::conditional_t<double_terms, double, std::int32_t>;
};

/// How Instruction's chains run in lanes. Per output and instruction, each term is
/// trunc(a * b * 2^(F - emax)) in float lanes: a and b are floats holding the operands exactly,
/// their product is exact (significands of at most 24 bits together), and scaling by a power of
/// two is exact unless the result is below 2^-126, where the cut gives 0 anyway; the truncating
/// float-to-int32 conversion is the cut toward zero. The accumulator is aligned the same way.
/// Whether that computes exactly what inner_product does for a pair of operand types is
/// lane_fit's question; this part depends on the instruction alone, so the lanes are compiled
/// once per model.
template <InnerProductModel Instruction>
struct lane_plan {
    static constexpr int F = Instruction::alignment_bits;
    static constexpr int P = Instruction::result_bits;
    static constexpr std::size_t K = Instruction::k;
    static constexpr int bits = sum_bits<Instruction>;
    /// Operands with exponents in [min_a, max_a] and [min_b, max_b], chains of k products: nonzero
    /// operands are float normals (flush-to-zero modes change nothing); every product's exponent
    /// is at least F - 126, so 2^(F - emax) is a normal float wherever a product is nonzero; a
    /// nonzero result, a multiple of the smallest product's last place, is at least 2^-126; a
    /// chain's sum stays below k times the largest product.
    [[nodiscard]] static constexpr bool in_range(int min_a, int max_a, int min_b, int max_b, std::size_t k) noexcept
    {
        return lanes_in_range(F, min_a, max_a, min_b, max_b, k);
    }
    /// The float type that holds the exact sum (accumulator and terms) exactly: float up to 24
    /// bits, else double (`wide`); lane_arithmetic's result_mask clears the bits below its P-th
    /// significant bit: the cut toward zero.
    static constexpr bool wide_double = bits > 24;
    /// Clears the bits of a normal float below its min(P, F + 1)-th significant bit.
    static constexpr std::uint32_t accumulator_mask = ~((std::uint32_t{1} << (24 - std::min(P, F + 1))) - 1);
    /// How many terms (each below 2^(F + 2) units) one int32 sum holds. Where K needs more
    /// (b200_f8f6f4: 32 terms below 2^27), runs of that many are summed in int32 lanes and the
    /// runs' sums in int64 lanes: the inner loop stays int32.
    static constexpr std::size_t int32_run =
        F + 2 <= 31 ? static_cast<std::size_t>(std::uint64_t{INT32_MAX} / ((std::uint64_t{1} << (F + 2)) - 1)) : 0;
    static constexpr bool sum_in_int32 = int32_run >= K;
    /// Terms of F + 2 > 30 bits (b200_qmma, F = 40): each trunc(a * b * 2^(F - emax)) is still
    /// exact in float (a whole number below 2^(F + 2), or truncated in float where it is not), and
    /// the terms and the accumulator sum exactly in double lanes (the whole sum below 2^53:
    /// lane_fit checks bits <= 53).
    static constexpr bool double_terms = F + 2 > 30;
    /// trunc(x) for such a term x (|x| < 2^(F + 2), exact in float) in two int32 parts, both
    /// truncating conversions: high = trunc(x / 2^split_bits) and low = trunc(x - high *
    /// 2^split_bits), x's bits below 2^split_bits (exact in float, x's sign or zero), so that
    /// trunc(x) = high * 2^split_bits + low. Runs of up to 2^(31 - F + 2 - split_bits) terms, and
    /// of 2^(31 - split_bits), sum in int32 (F = 40: 2^9 and 2^11; K <= 32 here).
    static constexpr int split_bits = (F + 2) / 2;
    /// The K terms and the aligned accumulator (below 2^(F + 1)) sum in int32 too: one
    /// conversion to `wide` per output instead of two (v100: 4 (2^25 - 1) + 2^24).
    static constexpr bool join_in_int32 =
        sum_in_int32 && !double_terms &&
        K * ((std::uint64_t{1} << (F + 2)) - 1) + (std::uint64_t{1} << (F + 1)) <= std::uint64_t{INT32_MAX};
    /// Where the joined int32 sum needs more than a float's 24 bits, cut toward zero to P <= 24
    /// bits from its float conversion (nearest, then a step toward zero where that went away from
    /// zero) rather than through double: the sum must stay clear of 2^31 - 128, which would round
    /// to 2^31, past int32.
    static constexpr bool float_normalisation =
        join_in_int32 && wide_double && P <= 24 &&
        Instruction::rules::normalisation == rounding_mode::toward_zero &&
        K * ((std::uint64_t{1} << (F + 2)) - 1) + (std::uint64_t{1} << (F + 1)) < (std::uint64_t{1} << 31) - 128;
    /// Rows of A whose chains run side by side (lane_steps).
    static constexpr std::size_t rows = lane_rows_for(K);
    /// Whether lane_steps has a second copy of the step, without the floor's clamp and blend, for
    /// tasks without a zero operand: a tenth of a K = 4 or 8 step, a few percent of a longer one,
    /// where the second copy measured slower (fp8, K = 32: 12%).
    static constexpr bool floorless_steps = K <= 8;
    /// The steps' plan: the accumulator enters the sum aligned as an int32 (below 2^(F + 1)) or,
    /// with double_terms, a whole double.
    static constexpr lane_steps_plan steps = {K,
                                              P,
                                              Instruction::rules::normalisation == rounding_mode::nearest_even,
                                              wide_double,
                                              double_terms,
                                              sum_in_int32,
                                              sum_in_int32 ? 0 : int32_run,
                                              join_in_int32,
                                              float_normalisation,
                                              accumulator_mask,
                                              double_terms ? split_bits : 0,
                                              rows,
                                              floorless_steps};
    using wide = typename lane_arithmetic<steps>::wide;
};

/// Whether Instruction's chains over TA x TB run in lanes (lane_plan) and compute exactly what
/// inner_product does: the rules are the H100's (every cut toward zero, nominal exponents);
/// products need no right shift at emax; each term (below 2^(F + 2) units) fits int32, and the
/// whole exact sum fits `wide` (`usable`; lane_plan::lane_sum holds the K terms' sum); and the data keep operands, products and results within
/// float32's normal range (lane_plan::in_range). `always_in_range` says the formats guarantee it
/// (fp8, f16); otherwise (bf16) the data's exponents are checked at run time and out-of-range data
/// run the reference engine.
template <InnerProductModel Instruction, class TA, class TB>
struct lane_fit {
    using rules = typename Instruction::rules;
    using plan = lane_plan<Instruction>;
    using fa = lane_format<typename Instruction::operands, TA>;
    using fb = lane_format<typename Instruction::operands, TB>;
    /// A product at emax is a whole number of units 2^(emax - F).
    static constexpr int product_shift = plan::F - fa::mantissa_bits - fb::mantissa_bits;
    static constexpr bool operands_fit_float =
        fa::mantissa_bits + fb::mantissa_bits + 2 <= 24 && fa::smallest_exponent >= -126 && fb::smallest_exponent >= -126 &&
        fa::smallest_exponent - fa::mantissa_bits >= -149 && fb::smallest_exponent - fb::mantissa_bits >= -149 &&
        fa::largest_exponent <= 127 && fb::largest_exponent <= 127;
    static constexpr bool terms_fit_int32 = plan::F + 2 <= 30;
    /// The two int32 parts of double_terms' terms: K + 1 of each part (below 2^(F + 2 -
    /// split_bits) and 2^split_bits) fit int32.
    static constexpr bool split_fits =
        plan::double_terms && plan::F + 2 - plan::split_bits <= 30 &&
        (plan::K + 1) * (std::uint64_t{1} << (plan::F + 2 - plan::split_bits)) <= std::uint64_t{INT32_MAX} &&
        (plan::K + 1) * (std::uint64_t{1} << plan::split_bits) <= std::uint64_t{INT32_MAX};
    /// The sum rounded to nearest even (b200_qmma): on the double holding the exact sum, by an add
    /// on its bits before the mask; P = 24 and F + 1 >= 24, so that an accumulator alone (below
    /// the floor) needs no rounding.
    static constexpr bool normalisation_fits =
        rules::normalisation == rounding_mode::toward_zero ||
        (rules::normalisation == rounding_mode::nearest_even && std::same_as<typename plan::wide, double> &&
         plan::P == 24 && plan::F + 1 >= 24);
    static constexpr bool usable = rules::exponent == product_exponent::nominal &&
                                   rules::alignment == rounding_mode::toward_zero && normalisation_fits &&
                                   product_shift >= 0 && operands_fit_float &&
                                   (terms_fit_int32 || split_fits) && plan::bits <= 53;
    static constexpr bool always_in_range = plan::in_range(fa::smallest_exponent, fa::largest_exponent,
                                                           fb::smallest_exponent, fb::largest_exponent, ~std::size_t{0});
};

inline constexpr std::size_t lane_width = 32;

/// An operand as the lanes read it: its value as a float (exact: the formats fit) and its nominal
/// exponent, floor(log2 |x|) clamped to the format's smallest normal exponent as subnormals have
/// it. Zeros and non-finite codes read as 0 with exponent lane_zero_exponent; `special` marks the
/// non-finite ones.
struct lane_operand {
    float value;
    std::int16_t exponent;
    bool special;
};

/// The lane operand of the T whose value is v: v on T's grid, or non-finite.
template <EncodedFloat T>
[[nodiscard]] constexpr lane_operand decode_lane_value(float v) noexcept
{
    const auto bits = std::bit_cast<std::uint32_t>(v);
    const int field = static_cast<int>((bits >> 23) & 0xffu);
    const bool special = field == 0xff;
    const bool zero = (bits & 0x7fffffffu) == 0;
    const int exponent = std::max(field - 127, min_exponent<format_of<T>>);
    return {special ? 0.0f : v, special || zero ? lane_zero_exponent : static_cast<std::int16_t>(exponent), special};
}

template <EncodedFloat T>
[[nodiscard]] constexpr lane_operand decode_lane_operand(const T& x) noexcept
{
    return decode_lane_value<T>(float_traits<T>::to_float(x));
}

/// Every code of an 8-bit format decoded at compile time.
template <EncodedFloat T>
inline constexpr auto lane_table = [] {
    std::array<lane_operand, 256> table{};
    using storage = typename format_of<T>::storage_type;
    for (unsigned code = 0; code < table.size(); ++code)
        table[code] = decode_lane_operand(float_traits<T>::from_bits(static_cast<storage>(code)));
    return table;
}();

template <EncodedFloat T>
[[nodiscard]] lane_operand lane_decode(const T& x) noexcept
{
    if constexpr (format_of<T>::total_bits <= 8) return lane_table<T>[code_of(x)];
    else return decode_lane_operand(x);
}

/// What decoding a run of operands found: a non-finite one, and the exponent range of the nonzero
/// finite ones (empty: min > max).
struct lane_run {
    bool special = false;
    int min_exponent = 1 << 14;
    int max_exponent = -(1 << 14);
};

/// Decodes `count` contiguous operands of type T from data[first] into values and exponents;
/// `special`, where given, gets each non-finite one's flag or-ed in. The lanes' one typed step.
/// With TrackRange the exponent range is found too (the formats that do not bound it: it costs
/// a tenth of an fp8 GEMM's time).
using lane_reader = lane_run (*)(const void* data, std::size_t first, std::size_t count, float* value,
                                 std::int16_t* exponent, unsigned char* special) noexcept;

/// An operand of type T stored as Stored (T, or a float32 on T's grid: see stored_as), decoded.
template <EncodedFloat T, class Stored>
[[nodiscard]] lane_operand lane_decode_stored(const Stored& x) noexcept
{
    // A float32 on T's grid is its own value: decoded without the trip through T's code.
    if constexpr (std::same_as<Stored, T>) return lane_decode(x);
    else return decode_lane_value<T>(x);
}

/// The 16-bit formats whose value the lanes build from the bits, branch-free.
template <class T>
inline constexpr bool lane_float_bits = std::same_as<T, Eigen::half> || std::same_as<T, Eigen::bfloat16>;

/// x's value as a float: a float itself, or an f16 or bf16 from its bits (f16 subnormals as
/// mantissa * 2^-24, exact; non-finite codes to inf or a NaN, as Eigen's conversion gives them).
/// Masks rather than selects, and the bits read by memcpy: the forms GCC vectorises.
template <class Stored>
[[nodiscard]] inline float lane_float_of(const Stored& x) noexcept
{
    if constexpr (lane_float_bits<Stored>) {
        std::uint16_t code;
        std::memcpy(&code, &x, sizeof code);
        if constexpr (std::same_as<Stored, Eigen::bfloat16>) return std::bit_cast<float>(std::uint32_t{code} << 16);
        const std::uint32_t h = code;
        const std::uint32_t field = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, sign = (h & 0x8000u) << 16;
        const std::uint32_t normal = (field + 112u + static_cast<std::uint32_t>(field == 0x1f) * 112u) << 23 | mantissa << 13;
        // A subnormal: the mantissa as a float (exact) times 2^-24.
        const std::uint32_t subnormal =
            std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(mantissa)) * 0x1p-24f);
        const std::uint32_t is_subnormal = -static_cast<std::uint32_t>(field == 0);
        return std::bit_cast<float>(sign | (subnormal & is_subnormal) | (normal & ~is_subnormal));
    } else {
        return x;
    }
}

template <EncodedFloat T, bool TrackRange, class Stored = T>
lane_run read_lane_operands(const void* data, std::size_t first, std::size_t count, float* value,
                            std::int16_t* exponent, unsigned char* special) noexcept
{
    const Stored* x = static_cast<const Stored*>(data) + first;
    // Branch-free over the run; the flags of non-finite operands, rare, in a second pass.
    bool any_special = false;
    int low = lane_run{}.min_exponent, high = lane_run{}.max_exponent;
    if constexpr (std::same_as<Stored, T> && !lane_float_bits<T>) {
        for (std::size_t i = 0; i < count; ++i) {
            const lane_operand o = lane_decode(x[i]);
            value[i] = o.value;
            exponent[i] = o.exponent;
            any_special |= o.special;
            if constexpr (TrackRange) {
                const bool counted = o.value != 0.0f;
                low = counted ? std::min(low, static_cast<int>(o.exponent)) : low;
                high = counted ? std::max(high, static_cast<int>(o.exponent)) : high;
            }
        }
    } else {
        // decode_lane_value spelled out on the float's bits, in the form the compiler vectorises
        // (a recipe's operands are float32 on T's grid: 4 bytes per element to read; f16 and bf16
        // reach it through their float's bits, as Eigen's conversion does not vectorise).
        constexpr int smallest = min_exponent<format_of<T>>;
        unsigned specials = 0;
        for (std::size_t i = 0; i < count; ++i) {
            const float v = lane_float_of(x[i]);
            const auto bits = std::bit_cast<std::uint32_t>(v);
            const int field = static_cast<int>((bits >> 23) & 0xffu);
            const bool non_finite = field == 0xff;
            const bool zero = (bits & 0x7fffffffu) == 0;
            const int e = std::max(field - 127, smallest);
            value[i] = std::bit_cast<float>(bits & (non_finite ? 0u : ~0u));
            exponent[i] = static_cast<std::int16_t>(non_finite || zero ? int(lane_zero_exponent) : e);
            specials |= non_finite ? 1u : 0u;
        }
        any_special = specials != 0;
        if constexpr (TrackRange) {
            // Over the exponents just stored, one reduction per loop: in the loop above, or
            // together, they keep it scalar (lane_zero_exponent lies below every real exponent).
            for (std::size_t i = 0; i < count; ++i) {
                const int e = exponent[i];
                low = std::min(low, e != lane_zero_exponent ? e : lane_run{}.min_exponent);
            }
            for (std::size_t i = 0; i < count; ++i) high = std::max(high, int{exponent[i]});
            if (high == lane_zero_exponent) high = lane_run{}.max_exponent;
        }
    }
    if (special && any_special) {
        for (std::size_t i = 0; i < count; ++i) special[i] |= lane_decode_stored<T>(x[i]).special ? 1 : 0;
    }
    lane_run run;
    run.special = any_special;
    if constexpr (TrackRange) {
        run.min_exponent = low;
        run.max_exponent = high;
    }
    return run;
}

/// One GEMM operand as both paths read it.
struct gemm_operand {
    const void* data;
    lane_reader lanes;
    operand_reader operands;
};

template <bool TrackRange, EncodedFloat T>
[[nodiscard]] gemm_operand gemm_operand_of(const T* data) noexcept
{
    return {data, &read_lane_operands<T, TrackRange>, &read_operands<T>};
}

/// An operand of type T held as float32 values on T's grid.
template <EncodedFloat T, bool TrackRange>
[[nodiscard]] gemm_operand gemm_operand_on_grid(const float* data) noexcept
{
    return {data, &read_lane_operands<T, TrackRange, float>, &read_operands<T, float>};
}

/// float32 operands as a tf32 unit reads them, for the lanes: the tf32 value as a float (exact),
/// its nominal exponent, the exponent range of the nonzero finite ones; decompose_tf32 spelled out
/// on the bits, branch-free.
template <tf32_input Input>
lane_run read_tf32_lane_operands(const void* data, std::size_t first, std::size_t count, float* value,
                                 std::int16_t* exponent, unsigned char* special) noexcept
{
    const float* x = static_cast<const float*>(data) + first;
    int low = lane_run{}.min_exponent, high = lane_run{}.max_exponent;
    unsigned specials = 0;
    for (std::size_t i = 0; i < count; ++i) {
        const auto bits = std::bit_cast<std::uint32_t>(x[i]);
        std::uint32_t magnitude = bits & 0x7fffffffu;
        const bool nan = magnitude > 0x7f800000u;
        if constexpr (Input == tf32_input::nearest_even) {
            const std::uint32_t rest = magnitude & 0x1fffu;
            const std::uint32_t up = (rest > 0x1000u || (rest == 0x1000u && (magnitude & 0x2000u) != 0)) ? 0x2000u : 0u;
            magnitude = nan || magnitude == 0x7f800000u ? magnitude : (magnitude & ~std::uint32_t{0x1fffu}) + up;
        } else {
            magnitude &= ~std::uint32_t{0x1fffu};
        }
        const int field = static_cast<int>(magnitude >> 23);
        const bool non_finite = nan || field == 0xff;
        const bool zero = magnitude == 0;
        const int e = std::max(field - 127, -126);
        value[i] = std::bit_cast<float>(((bits & 0x80000000u) | magnitude) & (non_finite ? 0u : ~0u));
        exponent[i] = static_cast<std::int16_t>(non_finite || zero ? int(lane_zero_exponent) : e);
        specials |= non_finite ? 1u : 0u;
    }
    // The exponent range over what was just stored, and the flags of non-finite operands (rare)
    // in passes of their own: in the loop above they kept it scalar. One reduction per loop, the
    // form GCC vectorises (lane_zero_exponent lies below every real exponent).
    for (std::size_t i = 0; i < count; ++i) {
        const int e = exponent[i];
        low = std::min(low, e != lane_zero_exponent ? e : lane_run{}.min_exponent);
    }
    for (std::size_t i = 0; i < count; ++i) high = std::max(high, int{exponent[i]});
    if (high == lane_zero_exponent) high = lane_run{}.max_exponent;
    if (special && specials != 0) {
        for (std::size_t i = 0; i < count; ++i) {
            std::uint32_t magnitude = std::bit_cast<std::uint32_t>(x[i]) & 0x7fffffffu;
            const bool nan = magnitude > 0x7f800000u;
            if constexpr (Input == tf32_input::nearest_even) {
                const std::uint32_t rest = magnitude & 0x1fffu;
                const std::uint32_t up = (rest > 0x1000u || (rest == 0x1000u && (magnitude & 0x2000u) != 0)) ? 0x2000u : 0u;
                magnitude = nan || magnitude == 0x7f800000u ? magnitude : (magnitude & ~std::uint32_t{0x1fffu}) + up;
            }
            special[i] |= nan || (magnitude >> 23) == 0xff ? 1 : 0;
        }
    }
    lane_run run;
    run.special = specials != 0;
    run.min_exponent = low;
    run.max_exponent = high;
    return run;
}

/// float32 operands of a tf32 unit (operand set Operands), as both paths read them.
template <class Operands>
[[nodiscard]] gemm_operand gemm_operand_tf32(const float* data) noexcept
{
    return {data, &read_tf32_lane_operands<Operands::input>, &read_tf32_operands<Operands::input>};
}

/// The most mantissa bits of an operand set's formats; -1 where not known (tf32 reads floats).
template <class Operands>
inline constexpr int operand_mantissa_bits = -1;
template <EncodedFloat... Ts>
inline constexpr int operand_mantissa_bits<any_pair_of<Ts...>> = std::max({format_of<Ts>::mantissa_bits...});
template <EncodedFloat... Ts>
inline constexpr int operand_mantissa_bits<same_type_of<Ts...>> = std::max({format_of<Ts>::mantissa_bits...});

/// What the uncut path of double_terms models (lane_steps) needs to know of the data: B's panel
/// as doubles (null: no uncut path), a floor under every nonzero product's last place and a
/// ceiling over every product's nominal exponent.
struct uncut_terms {
    const double* b_wide = nullptr;
    int lsb_floor = 0;
    int exponent_ceiling = 0;
};

/// The steps of lane_chain for `rows` rows of A (1 to Rows; a_val and a_exp hold them k apart)
/// against one block of B, out row r at out + r * out_stride. Each step of a chain waits for the
/// one before (its emax needs the accumulator), and with short instructions (K = 4) that latency,
/// not the work, bounds a single chain: Rows chains side by side (lane_plan::rows) keep the vector
/// units busy. Rows past `rows` repeat the last one and are not stored. k is a multiple of K
/// (gemm_lanes pads the panels with zero operands): every step is a whole instruction.
/// With double_terms and `uncut` given, a step where no term can lose a bit to the cut (every
/// product's last place and the accumulator's at or above 2^(emax - F), by the data's bounds and
/// each lane's accumulator) sums its products and the accumulator exactly in double lanes,
/// multiply-adds of exact products: the exact sum, rounded as the normalisation says; any other
/// step runs the aligned terms.
/// Every `interval` instructions (the model's promotion interval; 0: never) the chain's sum joins a
/// float32 total and restarts from +0. An argument, not a template parameter: models that differ
/// only in it (h100_cublaslt_fp8 and its _fast form) share one compiled copy of the steps; so is
/// F, the instruction's alignment_bits (lane_steps_plan).
template <lane_steps_plan S>
void lane_steps(int F, const float* a_val, const std::int16_t* a_exp, std::size_t rows, const float* b_val,
                const std::int16_t* b_exp, std::size_t k, float* out, std::size_t out_stride, std::size_t columns,
                const uncut_terms& uncut, bool no_zero, std::size_t interval)
{
    using Plan = lane_arithmetic<S>;
    using wide = typename Plan::wide;
    using wide_bits = typename Plan::wide_bits;
    constexpr std::size_t W = lane_width;
    constexpr std::size_t R = Plan::rows;
    constexpr std::size_t K = Plan::K;

    std::array<const float*, R> av{};
    std::array<const std::int16_t*, R> ae{};
    for (std::size_t r = 0; r < R; ++r) {
        const std::size_t row = std::min(r, rows - 1);
        av[r] = a_val + row * k;
        ae[r] = a_exp + row * k;
    }
    alignas(64) float c[R][W] = {}, total[R][W] = {};

    // With AVX-512 the cut of the joined int32 sums to P bits is one conversion with its rounding
    // toward zero (embedded in the instruction, the environment untouched), a tenth of a K = 4
    // step: the step's loop leaves the sums, and this loop cuts and scales them.
#if defined(__AVX512F__)
    constexpr bool split_cut = Plan::float_normalisation;
    const auto cut_toward_zero = [](const std::int32_t* sums, const float* scales, float* into) {
        for (std::size_t i = 0; i < R * W; i += 16) {
            __m512 x = _mm512_cvt_roundepi32_ps(_mm512_load_si512(sums + i), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            x = _mm512_castsi512_ps(
                _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(Plan::float_result_mask))));
            _mm512_store_ps(into + i, _mm512_mul_ps(x, _mm512_load_ps(scales + i)));
        }
    };
#else
    constexpr bool split_cut = false;
    const auto cut_toward_zero = [](const std::int32_t*, const float*, float*) {};
#endif
    // One instruction of K products for every lane and row: one loop over the lanes, the rows and
    // products unrolled in it (the form the compiler vectorises, int16 exponents and int32 and
    // float values in the same lanes), each row's chain independent of the others.
    // MayBeBelow: some product may be zero, so that a lane may fall below the floor (every product
    // zero and the accumulator zero or tiny); without a zero operand in the task's rows and
    // block none can, and the clamp and the blend below (a tenth of a K = 4 step) are left out.
    // The accumulators come in as a restrict pointer: captured by reference they would be read
    // through the closure, and g++ -O2 (whose cheap cost model adds no run-time alias checks)
    // could not tell them from the operands and left the loop scalar (4.6x slower for SSE2).
    // F's constants as values of the step (a reference into the frame would be reloaded).
    const std::int32_t floor = F - 126;
    const std::uint32_t scale_base = static_cast<std::uint32_t>(127 + F) << 23;
    const std::uint32_t unscale_base = static_cast<std::uint32_t>(127 - F) << 23;
    const auto cut_step = [&, floor, scale_base, unscale_base]<bool MayBeBelow>(float (*__restrict acc)[W], const std::array<const float*, R>& a,
                                               const std::array<const std::int16_t*, R>& ea, const float* b,
                                               const std::int16_t* eb) __attribute__((always_inline)) {
        alignas(64) std::int32_t joined[R][W];
        alignas(64) float unscales[R][W];
        alignas(64) std::uint32_t alone_below[R][W], keep[R][W];
        for (std::size_t j = 0; j < W; ++j) {
#pragma GCC unroll 16
            for (std::size_t r = 0; r < R; ++r) {
                // The accumulator: zero or a normal float (gemm_lanes runs only data in range); a
                // zero reads as -127, below every nonzero product's exponent (F - 126 or more), so
                // that it takes no part, as lane_zero_exponent would.
                const float cr = acc[r][j];
                const auto c_bits = std::bit_cast<std::uint32_t>(cr);
                auto emax = static_cast<std::int16_t>(static_cast<std::int32_t>((c_bits >> 23) & 0xffu) - 127);
#pragma GCC unroll 64
                for (std::size_t q = 0; q < K; ++q)
                    emax = std::max(emax, static_cast<std::int16_t>(ea[r][q] + eb[q * W + j]));
                // Units of 2^(emax - F). Every product's exponent is at least F - 126: below it
                // (every product zero, the accumulator zero or tiny) the floor keeps the scales
                // normal, and the result is set apart in the normalisation.
                const std::int32_t e_max = emax;
                const auto e_bits = static_cast<std::uint32_t>(MayBeBelow ? std::max(e_max, floor) : e_max) << 23;
                const float scale = std::bit_cast<float>(scale_base - e_bits);
                const float unscale = std::bit_cast<float>(unscale_base + e_bits);
                // Terms, exact as lane_fit says; the accumulator aligned the same way.
                typename Plan::lane_sum sum;
                typename Plan::c_term c_aligned;
                if constexpr (Plan::double_terms) {
                    // trunc in float is the cut toward zero (the product times the power of two is
                    // exact wherever it is 1 or more); the whole numbers sum exactly in double.
                    const float xc = cr * scale;
                    const std::int32_t hc = Plan::split_high(xc);
                    c_aligned = static_cast<double>(hc) * Plan::split_unit + static_cast<double>(Plan::split_low(xc, hc));
#if defined(__AVX512DQ__)
                    // A float-to-int64 conversion in vector lanes (vcvttps2qq): each term whole, int64 sums.
                    std::int64_t whole = 0;
#pragma GCC unroll 64
                    for (std::size_t q = 0; q < K; ++q) whole += static_cast<std::int64_t>(a[r][q] * b[q * W + j] * scale);
                    sum = static_cast<double>(whole);
#else
                    // Elsewhere (SSE2, AVX2, NEON: no vector float-to-int64 conversion) in two int32 parts.
                    std::int32_t high = 0, low = 0;
#pragma GCC unroll 64
                    for (std::size_t q = 0; q < K; ++q) {
                        const float x = a[r][q] * b[q * W + j] * scale;
                        const std::int32_t h = Plan::split_high(x);
                        high += h;
                        low += Plan::split_low(x, h);
                    }
                    sum = static_cast<double>(high) * Plan::split_unit + static_cast<double>(low);
#endif
                } else {
                    c_aligned = static_cast<std::int32_t>(cr * scale);
                    if constexpr (Plan::sum_in_int32) {
                        sum = 0;
#pragma GCC unroll 64
                        for (std::size_t q = 0; q < K; ++q) sum += static_cast<std::int32_t>(a[r][q] * b[q * W + j] * scale);
                    } else {
                        // Runs of int32_run terms in int32 lanes, their sums in int64 lanes.
                        sum = 0;
                        constexpr std::size_t run_length = std::min(Plan::int32_run, K);
#pragma GCC unroll 64
                        for (std::size_t q0 = 0; q0 < K; q0 += run_length) {
                            std::int32_t run = 0;
#pragma GCC unroll 64
                            for (std::size_t q = q0; q < q0 + run_length; ++q)
                                if (q < K) run += static_cast<std::int32_t>(a[r][q] * b[q * W + j] * scale);
                            sum += run;
                        }
                    }
                }
                // Normalise: the exact sum cut toward zero to P bits, which a float holds, then
                // scaled by 2^(emax - F) (exact). Below the floor the result is the accumulator cut
                // to min(P, F + 1) bits.
                std::uint32_t normalised;
                if constexpr (split_cut) {
                    // The sum and the scale kept for cut_toward_zero, after the loop.
                    joined[r][j] = sum + c_aligned;
                    unscales[r][j] = unscale;
                    if constexpr (MayBeBelow) {
                        const auto below = static_cast<std::uint32_t>(-static_cast<std::int32_t>(e_max < floor));
                        alone_below[r][j] = c_bits & Plan::accumulator_mask & below;
                        keep[r][j] = ~below;
                    }
                    continue;
                } else if constexpr (Plan::float_normalisation) {
                    // The int32 sum to float rounds to nearest; where that went away from zero
                    // (back in int32, exact, it lies beyond the sum) the float next to it toward
                    // zero is the cut to 24 bits: cheaper than the trip through double.
                    const std::int32_t exact = sum + c_aligned;
                    const float nearest = static_cast<float>(exact);
                    const auto back = static_cast<std::int32_t>(nearest);
                    const auto away = static_cast<std::uint32_t>(std::abs(back) > std::abs(exact));
                    const auto cut = (std::bit_cast<std::uint32_t>(nearest) - away) & Plan::float_result_mask;
                    normalised = std::bit_cast<std::uint32_t>(std::bit_cast<float>(cut) * unscale);
                } else {
                    // The exact sum converts exactly to `wide`; masking its significand cuts it.
                    wide exact;
                    if constexpr (Plan::join_in_int32) exact = static_cast<wide>(sum + c_aligned);
                    else exact = static_cast<wide>(sum) + static_cast<wide>(c_aligned);
                    auto exact_bits = std::bit_cast<wide_bits>(exact);
                    if constexpr (S.nearest_even) {
                        // Round to P bits, ties to even: add half a unit less one, plus the last kept
                        // bit; a carry runs into the exponent field as it should (the sign bit stays
                        // clear of it).
                        constexpr int dropped = Plan::wide_mantissa + 1 - Plan::P;
                        exact_bits += ((wide_bits{1} << (dropped - 1)) - 1) + ((exact_bits >> dropped) & 1u);
                    }
                    const wide cut = std::bit_cast<wide>(static_cast<wide_bits>(exact_bits & Plan::result_mask));
                    normalised = std::bit_cast<std::uint32_t>(static_cast<float>(cut) * unscale);
                }
                // A blend of bits: a select of floats would be a branch under -ftrapping-math.
                if constexpr (MayBeBelow) {
                    const auto alone = c_bits & Plan::accumulator_mask;
                    const auto below = static_cast<std::uint32_t>(-static_cast<std::int32_t>(e_max < floor));
                    acc[r][j] = std::bit_cast<float>((alone & below) | (normalised & ~below));
                } else {
                    acc[r][j] = std::bit_cast<float>(normalised);
                }
            }
        }
        if constexpr (split_cut) {
            cut_toward_zero(&joined[0][0], &unscales[0][0], &acc[0][0]);
            if constexpr (MayBeBelow) {
                for (std::size_t r = 0; r < R; ++r)
                    for (std::size_t j = 0; j < W; ++j)
                        acc[r][j] = std::bit_cast<float>(alone_below[r][j] | (std::bit_cast<std::uint32_t>(acc[r][j]) & keep[r][j]));
            }
        }
    };

    std::size_t in_group = 0;
    // The steps, each a whole instruction; a loop body, not a lambda, so that c and total stay
    // locals the vectoriser can tell apart from the operands.
    for (std::size_t s = 0; s < k; s += K) {
        const std::size_t end = s + K;
        bool uncut_step = false;
        if constexpr (Plan::double_terms) {
            if (uncut.b_wide != nullptr) {
                // emax <= max(e_c, ceiling): products keep every bit where that is at most
                // floor + F; the accumulator (24 bits, last place e_c - 23) where e_c >= ceiling - F + 23.
                std::uint32_t cut = 0;
                const std::int32_t c_least = uncut.exponent_ceiling - F + 23, c_most = uncut.lsb_floor + F;
                const bool ceiling_cut = uncut.exponent_ceiling > c_most;
                for (std::size_t r = 0; r < R; ++r)
                    for (std::size_t j = 0; j < W; ++j) {
                        // On the bits (a float compare would not vectorise under -ftrapping-math).
                        const auto c_bits = std::bit_cast<std::uint32_t>(c[r][j]);
                        const auto e_c = static_cast<std::int32_t>((c_bits >> 23) & 0xffu) - 127;
                        const bool nonzero = (c_bits & 0x7fffffffu) != 0;
                        cut |= nonzero && (e_c < c_least || e_c > c_most) ? 1u : 0u;
                    }
                cut |= ceiling_cut ? 1u : 0u;
                uncut_step = cut == 0;
            }
            if (uncut_step) {
                // Each product is exact in double (fp8: at most 8 bits), and so is every partial
                // sum: all multiples of 2^(emax - F), below 2^(emax + 8) (F + 8 <= 48 bits). Two
                // sums (even and odd k) so that twice as many multiply-adds are in flight.
                for (std::size_t r = 0; r < R; ++r) {
                    alignas(64) std::array<double, W> exact{}, odd{};
                    for (std::size_t j = 0; j < W; ++j) {
                        exact[j] = static_cast<double>(c[r][j]);
                        odd[j] = 0.0;
                    }
                    std::size_t kk = s;
                    for (; kk + 1 < end; kk += 2) {
                        const double va = av[r][kk], vo = av[r][kk + 1];
                        const double* vb = uncut.b_wide + kk * W;
                        for (std::size_t j = 0; j < W; ++j) {
#if defined(__FMA__) || defined(__aarch64__)
                            exact[j] = std::fma(va, vb[j], exact[j]);
                            odd[j] = std::fma(vo, vb[W + j], odd[j]);
#else
                            exact[j] += va * vb[j];
                            odd[j] += vo * vb[W + j];
#endif
                        }
                    }
                    if (kk < end) {
                        const double va = av[r][kk];
                        const double* vb = uncut.b_wide + kk * W;
                        for (std::size_t j = 0; j < W; ++j) exact[j] += va * vb[j];
                    }
                    for (std::size_t j = 0; j < W; ++j) {
                        auto exact_bits = std::bit_cast<std::uint64_t>(exact[j] + odd[j]);
                        // An exact zero is +0 (whatever the rounding mode gave its sign).
                        exact_bits &= std::uint64_t{0} - static_cast<std::uint64_t>((exact_bits << 1) != 0);
                        if constexpr (S.nearest_even) {
                            constexpr int dropped = 52 + 1 - Plan::P;
                            exact_bits += ((std::uint64_t{1} << (dropped - 1)) - 1) + ((exact_bits >> dropped) & 1u);
                        }
                        exact_bits &= ~((std::uint64_t{1} << (52 + 1 - Plan::P)) - 1);
                        c[r][j] = static_cast<float>(std::bit_cast<double>(exact_bits));  // P <= 24 bits: exact
                    }
                }
            }
        }
        if (!uncut_step) {
            std::array<const float*, R> a;
            std::array<const std::int16_t*, R> ea;
            for (std::size_t r = 0; r < R; ++r) {
                a[r] = av[r] + s;
                ea[r] = ae[r] + s;
            }
            if constexpr (Plan::floorless_steps) {
                if (no_zero) cut_step.template operator()<false>(c, a, ea, b_val + s * W, b_exp + s * W);
                else cut_step.template operator()<true>(c, a, ea, b_val + s * W, b_exp + s * W);
            } else {
                cut_step.template operator()<true>(c, a, ea, b_val + s * W, b_exp + s * W);
            }
        }
        if (interval != 0) {
            if (++in_group == interval) {
                for (std::size_t r = 0; r < R; ++r)
                    for (std::size_t j = 0; j < W; ++j) {
                        total[r][j] += c[r][j];
                        c[r][j] = 0.0f;  // in this loop: a loop of its own would become a memset call
                    }
                in_group = 0;
            }
        }
    }
    for (std::size_t r = 0; r < std::min(R, rows); ++r) {
        if (interval != 0) {
            if (in_group != 0)
                for (std::size_t j = 0; j < W; ++j) total[r][j] += c[r][j];
            std::copy_n(total[r], columns, out + r * out_stride);
        } else {
            std::copy_n(c[r], columns, out + r * out_stride);
        }
    }
}

// The instructions that share their steps (detail/compiled_instances.hpp names one of each).
static_assert(lane_plan<a100_tf32>::steps == lane_plan<v100_hmma>::steps &&
              lane_plan<ada_tf32>::steps == lane_plan<v100_hmma>::steps &&
              lane_plan<ada_hmma>::steps == lane_plan<a100_hmma>::steps &&
              lane_plan<h100_tf32>::steps == lane_plan<a100_hmma>::steps &&
              lane_plan<b200_tf32>::steps == lane_plan<a100_hmma>::steps &&
              lane_plan<b200_hmma>::steps == lane_plan<h100_hmma>::steps);

/// lane_steps of one plan, as a value.
using lane_steps_fn = void (*)(int alignment_bits, const float* a_val, const std::int16_t* a_exp, std::size_t rows, const float* b_val,
                               const std::int16_t* b_exp, std::size_t k, float* out, std::size_t out_stride,
                               std::size_t columns, const uncut_terms& uncut, bool no_zero, std::size_t interval);

/// What the lanes' GEMM needs of a model, as values: its body (the decode, the exponent ranges,
/// the tasks, the non-finite outputs) is compiled once for every model, and only the steps and
/// the reference chain are each model's own code.
struct lane_model {
    int alignment_bits;              ///< F, for lanes_in_range
    std::size_t instruction_k;       ///< K: the panels' rows are padded to a multiple of it
    int uncut_mantissa;              ///< double_terms models: the operands' most mantissa bits (-1: no uncut path)
    std::size_t promotion_interval;  ///< the chain restarts every this many instructions (0: never)
    std::size_t rows;                ///< lane_plan::rows: rows of A per task
    lane_steps_fn steps;             ///< lane_steps<lane_plan<instruction>::steps>, given alignment_bits
    chain_fn reference;              ///< chain_reference<Model>: outputs that a NaN or inf operand reaches
};

template <GemmModel Model>
inline constexpr lane_model lane_model_of = [] {
    using instruction = typename Model::instruction;
    using plan = lane_plan<instruction>;
    constexpr int mantissa = operand_mantissa_bits<typename instruction::operands>;
    return lane_model{plan::F, instruction::k, plan::double_terms && mantissa >= 0 ? mantissa : -1, Model::promotion_interval,
                      plan::rows, &lane_steps<plan::steps>, &chain_reference<Model>};
}();

/// The GEMM in lanes of the model `model` describes, over operands whose pair lane_fit calls
/// usable; false (nothing written) when check_range is set and the data's exponents are out of
/// range. The operand types reach it as their readers, the model as its lane_model: one compiled
/// copy for every model and pair (a template only so that scalify::compiled can hold it).
template <class = void>
[[nodiscard]] bool gemm_lanes_with(const lane_model& model, gemm_operand a, gemm_operand b, bool check_range,
                                   std::size_t m, std::size_t k, std::size_t n, float* out)
{
    constexpr std::size_t W = lane_width;
    const std::size_t blocks = (n + W - 1) / W;

    // Decoded panels in per-thread buffers that only grow: fresh pages cost more than the decode.
    // Their K is padded to a multiple of the instruction's with zero operands, which take no part
    // (exponent lane_zero_exponent, term 0), so that every step the lanes run is a whole
    // instruction: a separate short last step, a second copy of the step's code, had doubled it.
    const std::size_t kp = (k + model.instruction_k - 1) / model.instruction_k * model.instruction_k;
    thread_local std::vector<float> a_val, b_val;
    thread_local std::vector<std::int16_t> a_exp, b_exp;
    thread_local std::vector<unsigned char> special_row, special_column;
    thread_local std::vector<lane_run> a_runs, b_runs;
    a_val.resize(m * kp);
    a_exp.resize(m * kp);
    special_row.assign(m, 0);
    b_val.resize(blocks * kp * W);
    b_exp.resize(blocks * kp * W);
    special_column.assign(n, 0);
    a_runs.assign(m, lane_run{});
    b_runs.assign(blocks, lane_run{});
    // The decode runs on the threads too (serial, it was a fifth of an fp8 GEMM's time on two
    // threads): a task per row of A and per block of B, the exponent ranges combined after.
    // Pointers, not the thread_local names: inside the loops those would be each worker's own.
    const auto each = [work = m * k + k * n](std::size_t count, auto&& body) {
        if (work < (std::size_t{1} << 15)) {
            for (std::size_t i = 0; i < count; ++i) body(i);
        } else {
            scalify::detail::parallel_for(count, body);
        }
    };
    {
        float* const values = a_val.data();
        std::int16_t* const exponents = a_exp.data();
        lane_run* const runs = a_runs.data();
        each(m, [=](std::size_t i) {
            runs[i] = a.lanes(a.data, i * k, k, values + i * kp, exponents + i * kp, nullptr);
            std::fill(values + i * kp + k, values + (i + 1) * kp, 0.0f);
            std::fill(exponents + i * kp + k, exponents + (i + 1) * kp, lane_zero_exponent);
        });
    }
    // B in blocks of W columns, each block K rows of W; columns past N read as zeros.
    {
        float* const values = b_val.data();
        std::int16_t* const exponents = b_exp.data();
        unsigned char* const specials = special_column.data();
        lane_run* const runs = b_runs.data();
        each(blocks, [=](std::size_t block) {
            const std::size_t j0 = block * W, width = std::min(W, n - j0);
            lane_run all;
            for (std::size_t p = 0; p < k; ++p) {
                const std::size_t at = (block * kp + p) * W;
                const lane_run run = b.lanes(b.data, p * n + j0, width, values + at, exponents + at, specials + j0);
                all.special = all.special || run.special;
                all.min_exponent = std::min(all.min_exponent, run.min_exponent);
                all.max_exponent = std::max(all.max_exponent, run.max_exponent);
                for (std::size_t j = width; j < W; ++j) {
                    values[at + j] = 0.0f;
                    exponents[at + j] = lane_zero_exponent;
                }
            }
            std::fill(values + (block * kp + k) * W, values + (block + 1) * kp * W, 0.0f);
            std::fill(exponents + (block * kp + k) * W, exponents + (block + 1) * kp * W, lane_zero_exponent);
            runs[block] = all;
        });
    }
    // Exponent ranges of the nonzero finite operands.
    int min_a = 1 << 14, max_a = -(1 << 14), min_b = 1 << 14, max_b = -(1 << 14);
    for (std::size_t i = 0; i < m; ++i) {
        special_row[i] = a_runs[i].special ? 1 : 0;
        min_a = std::min(min_a, a_runs[i].min_exponent);
        max_a = std::max(max_a, a_runs[i].max_exponent);
    }
    for (const lane_run& run : b_runs) {
        min_b = std::min(min_b, run.min_exponent);
        max_b = std::max(max_b, run.max_exponent);
    }

    if (check_range) {
        const bool some_zero_operand = min_a > max_a || min_b > max_b;  // every product is zero
        if (!some_zero_operand && !lanes_in_range(model.alignment_bits, min_a, max_a, min_b, max_b, k)) return false;
    }

    // The uncut path of double_terms models: the data's exponent bounds (a scan of the decoded
    // exponents: the fp8 readers do not track them) and B's panel as doubles.
    uncut_terms uncut;
    if (model.uncut_mantissa >= 0) {
        const int mantissa = model.uncut_mantissa;
        const auto bounds = [](const std::int16_t* e, std::size_t count) {
            int low = INT16_MAX, high = INT16_MIN;
            for (std::size_t i = 0; i < count; ++i) {
                const bool zero = e[i] == lane_zero_exponent;
                low = std::min(low, zero ? int(INT16_MAX) : int(e[i]));
                high = std::max(high, int(e[i]));
            }
            return std::pair{low, high};
        };
        const auto [low_a, high_a] = bounds(a_exp.data(), m * kp);
        const auto [low_b, high_b] = bounds(b_exp.data(), blocks * kp * W);
        // A zero side (low = INT16_MAX) makes every product zero: a floor that always holds.
        const int floor = low_a + low_b - 2 * mantissa;
        if (floor >= -126) {  // every nonzero result a normal float: a multiple of 2^floor
            thread_local std::vector<double> b_wide;
            b_wide.resize(b_val.size());
            for (std::size_t i = 0; i < b_val.size(); ++i) b_wide[i] = b_val[i];
            uncut = {b_wide.data(), floor, high_a + high_b};
        }
    }

    // Pointers, not the thread_local names: inside the loop those would be each worker's own.
    const float* av = a_val.data();
    const std::int16_t* ae = a_exp.data();
    const float* bv = b_val.data();
    const std::int16_t* be = b_exp.data();
    // Which rows of A and blocks of B hold a zero operand (zeros, non-finite codes, the columns
    // past N): a task without one has no zero product (lane_steps' no_zero).
    const auto holds_zero = [](const std::int16_t* e, std::size_t count) {
        unsigned zero = 0;
        for (std::size_t i = 0; i < count; ++i) zero |= e[i] == lane_zero_exponent ? 1u : 0u;
        return zero != 0;
    };
    thread_local std::vector<unsigned char> row_zero, block_zero;
    row_zero.resize(m);
    block_zero.resize(blocks);
    for (std::size_t i = 0; i < m; ++i) row_zero[i] = holds_zero(ae + i * kp, kp) ? 1 : 0;
    for (std::size_t block = 0; block < blocks; ++block) block_zero[block] = holds_zero(be + block * kp * W, kp * W) ? 1 : 0;
    const unsigned char* rz = row_zero.data();
    const unsigned char* bz = block_zero.data();
    // Tasks of the model's rows of A against one block of B.
    const std::size_t R = model.rows;
    const lane_steps_fn steps = model.steps;
    const std::size_t interval = model.promotion_interval;
    const int alignment_bits = model.alignment_bits;
    const std::size_t groups = (m + R - 1) / R;
    scalify::detail::parallel_for(blocks * groups, [=](std::size_t task) {
        const std::size_t block = task / groups, i = task % groups * R, rows = std::min(R, m - i);
        const std::size_t j0 = block * W;
        uncut_terms panel = uncut;
        if (panel.b_wide != nullptr) panel.b_wide += block * kp * W;
        bool no_zero = bz[block] == 0;
        for (std::size_t r = 0; r < rows; ++r) no_zero = no_zero && rz[i + r] == 0;
        steps(alignment_bits, av + i * kp, ae + i * kp, rows, bv + block * kp * W, be + block * kp * W, kp, out + i * n + j0, n,
              std::min(W, n - j0), panel, no_zero, interval);
    });

    // NaN and inf codes: the outputs they reach, again through the reference engine.
    const bool any_row = std::find(special_row.begin(), special_row.end(), 1) != special_row.end();
    const bool any_column = std::find(special_column.begin(), special_column.end(), 1) != special_column.end();
    if (!any_row && !any_column) return true;
    std::vector<operand> row(k), column(k);
    for (std::size_t j = 0; j < n; ++j) {
        const bool whole_column = special_column[j] != 0;
        if (!whole_column && !any_row) continue;
        b.operands(b.data, j, k, n, column.data());
        for (std::size_t i = 0; i < m; ++i) {
            if (!whole_column && !special_row[i]) continue;
            a.operands(a.data, i * k, k, 1, row.data());
            out[i * n + j] = model.reference(row.data(), column.data(), k);
        }
    }
    return true;
}

/// Model's GEMM in lanes (gemm_lanes_with).
template <GemmModel Model>
[[nodiscard]] bool gemm_lanes(gemm_operand a, gemm_operand b, bool check_range, std::size_t m, std::size_t k,
                              std::size_t n, float* out)
{
    return gemm_lanes_with(lane_model_of<Model>, a, b, check_range, m, k, n, out);
}

/// gemm_lanes over typed operands (TA x TB must be a pair lane_fit calls usable).
template <GemmModel Model, class TA, class TB>
[[nodiscard]] bool gemm_lanes(const TA* a, const TB* b, std::size_t m, std::size_t k, std::size_t n, float* out)
{
    using fit = lane_fit<typename Model::instruction, TA, TB>;
    static_assert(fit::usable, "these operand types do not run in lanes under this model");
    constexpr bool check_range = !fit::always_in_range;
    return gemm_lanes<Model>(gemm_operand_of<check_range>(a), gemm_operand_of<check_range>(b), check_range, m, k, n, out);
}

/// The engine of the inner_product_model units: the integer lanes where lane_fit holds and the
/// data are in range, the reference engine elsewhere.
template <InnerProductModel Instruction>
struct gemm_engine<Instruction> {
    template <GemmModel Model, class TA, class TB>
    static void run(const TA* a, const TB* b, std::size_t m, std::size_t k, std::size_t n, float* out)
    {
        using operands = typename Instruction::operands;
        if constexpr (reads_tf32<operands>) {
            // float32 operands read as tf32: lanes over data in range (checked), else the engine.
            if constexpr (lane_fit<Instruction, TA, TB>::usable) {
                if (gemm_lanes<Model>(gemm_operand_tf32<operands>(a), gemm_operand_tf32<operands>(b), true, m, k, n, out))
                    return;
            }
        } else if constexpr (lane_fit<Instruction, TA, TB>::usable) {
            if (gemm_lanes<Model>(a, b, m, k, n, out)) return;
        }
        gemm_reference<Model>(operands_for<operands>(a), operands_for<operands>(b), m, k, n, out);
    }

    template <GemmModel Model, class TA, class TB>
    static void run_on_grid(const float* a, const float* b, std::size_t m, std::size_t k, std::size_t n, float* out)
    {
        if constexpr (reads_tf32<typename Instruction::operands>) {
            // float32 operands, read as tf32 by the unit itself: run's path.
            run<Model>(a, b, m, k, n, out);
        } else {
            using fit = lane_fit<Instruction, TA, TB>;
            if constexpr (fit::usable) {
                constexpr bool check_range = !fit::always_in_range;
                if (gemm_lanes<Model>(gemm_operand_on_grid<TA, check_range>(a), gemm_operand_on_grid<TB, check_range>(b),
                                      check_range, m, k, n, out))
                    return;
            }
            gemm_reference<Model>({a, &read_operands<TA, float>}, {b, &read_operands<TB, float>}, m, k, n, out);
        }
    }

    template <GemmModel Model, class TA, class TB>
    [[nodiscard]] static float one(const TA* a, const TB* b, std::size_t k)
    {
        using operands = typename Instruction::operands;
        std::vector<operand> x(k), y(k);
        operands_for<operands>(a)(0, k, 1, x.data());
        operands_for<operands>(b)(0, k, 1, y.data());
        return chain_reference<Model>(x.data(), y.data(), k);
    }
};

template <GemmModel Model, class TA, class TB>
constexpr void check_operands() noexcept
{
    static_assert(Model::instruction::template takes<TA, TB>,
                  "this GEMM model's instruction does not take these operand types (h100_cublaslt_fp8, "
                  "h100_cublaslt_fp8_fast, ada_qmma_chain, b200_qmma_chain: float8_e4m3fn/float8_e5m2 in any "
                  "pair; b200_f8f6f4_chain: those, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn; the HMMA chains: "
                  "Eigen::half x Eigen::half or Eigen::bfloat16 x Eigen::bfloat16, v100_hmma_chain Eigen::half "
                  "only; the tf32 chains: float x float; amx_bf16_gemm, avx512_bf16_gemm: Eigen::bfloat16; "
                  "amx_fp16_gemm: Eigen::half; the CDNA chains: Eigen::half, Eigen::bfloat16, and on "
                  "mi300_mfma_chain float (xf32) and "
                  "float8_e4m3fnuz/float8_e5m2fnuz)");
    static_assert(Model::instruction::scale_block == 0,
                  "a block-scaled GEMM takes its scales: block_gemm<Model>(a, scale_a, b, scale_b), or gemm<Model> "
                  "of two BlockScaledArrays");
}

/// out (M x N, row-major) = gemm<Model>(a (M x K), b (K x N)), both row-major and contiguous.
template <GemmModel Model, class TA, class TB>
void gemm_into(const TA* a, const TB* b, std::size_t m, std::size_t k, std::size_t n, float* out)
{
    check_operands<Model, TA, TB>();
    if (m == 0 || n == 0) return;
    if (k == 0) {
        std::fill_n(out, m * n, 0.0f);
        return;
    }
    gemm_engine<typename Model::instruction>::template run<Model>(a, b, m, k, n, out);
}

/// gemm_into over float32 operands on the grids of TA and TB (a recipe's operands after their
/// casts): the bits gemm_into gives for the operands stored as TA and TB.
template <GemmModel Model, class TA, class TB>
void gemm_into_on_grid(const float* a, const float* b, std::size_t m, std::size_t k, std::size_t n, float* out)
{
    check_operands<Model, TA, TB>();
    if (m == 0 || n == 0) return;
    if (k == 0) {
        std::fill_n(out, m * n, 0.0f);
        return;
    }
    using engine = gemm_engine<typename Model::instruction>;
    if constexpr (requires { engine::template run_on_grid<Model, TA, TB>(a, b, m, k, n, out); })
        engine::template run_on_grid<Model, TA, TB>(a, b, m, k, n, out);
    else
        gemm_on_grid_as_stored<Model, TA, TB>(a, b, m, k, n, out);
}

}  // namespace detail

/// a (M x K) . b (K x N) as Model's GEMM computes it; shape_error unless both are 2-D with
/// matching inner dimensions. K = 0 gives +0 everywhere; M or N = 0 an empty M x N result.
template <GemmModel Model, class TA, class TB>
[[nodiscard]] xt::xarray<float> gemm(const xt::xarray<TA>& a, const xt::xarray<TB>& b)
{
    detail::check_operands<Model, TA, TB>();
    if (a.dimension() != 2 || b.dimension() != 2 || a.shape()[1] != b.shape()[0]) {
        SCALIFY_THROW(shape_error(fmt::format("tensor_core::gemm<{}>: shapes {} and {} do not multiply (need (M, K) "
                                              "and (K, N))",
                                              Model::name, shape_string(a.shape()), shape_string(b.shape()))));
    }
    const std::size_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
    auto out = xt::xarray<float>::from_shape({m, n});
    detail::gemm_into<Model>(a.data(), b.data(), m, k, n, out.data());
    return out;
}

/// One output of gemm<Model>: sum_k a[k]*b[k] over vectors of any (equal) length, as the GEMM's
/// chain computes it. shape_error for lengths that differ.
template <GemmModel Model, class TA, class TB>
[[nodiscard]] float gemm_dot(std::span<const TA> a, std::span<const TB> b)
{
    detail::check_operands<Model, TA, TB>();
    if (a.size() != b.size()) {
        SCALIFY_THROW(shape_error(fmt::format("tensor_core::gemm_dot<{}>: vectors of {} and {} elements", Model::name,
                                              a.size(), b.size())));
    }
    return detail::gemm_output<Model>(a.data(), b.data(), a.size());
}

/// gemm_dot over any contiguous ranges (std::vector, std::array, ...).
template <GemmModel Model, std::ranges::contiguous_range RA, std::ranges::contiguous_range RB>
    requires(!detail::is_const_span<std::remove_cvref_t<RA>> || !detail::is_const_span<std::remove_cvref_t<RB>>)
[[nodiscard]] float gemm_dot(const RA& a, const RB& b)
{
    using TA = std::ranges::range_value_t<RA>;
    using TB = std::ranges::range_value_t<RB>;
    return gemm_dot<Model, TA, TB>(std::span<const TA>(std::ranges::data(a), std::ranges::size(a)),
                                   std::span<const TB>(std::ranges::data(b), std::ranges::size(b)));
}

}  // namespace scalify::tensor_core

#ifdef SCALIFY_SEPARATE_COMPILATION  // scalify::compiled holds these (detail/compiled_instances.hpp)
#include <scalify/detail/compiled_instances.hpp>
SCALIFY_FOR_EACH_GEMM_MODEL(SCALIFY_TENSOR_CORE_INSTANCE, extern template)
SCALIFY_FOR_EACH_LANE_PLAN(SCALIFY_LANE_STEPS_INSTANCE, extern template)
SCALIFY_GEMM_ENGINE_INSTANCES(extern template)
#endif
