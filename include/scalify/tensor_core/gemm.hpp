#pragma once
/// \file tensor_core/gemm.hpp
/// gemm<Model>(a, b): an (M x K) . (K x N) product as a GPU GEMM computes it, bit for bit: each
/// output a chain of Model::instruction along K (tensor_core/model.hpp says how chains are cut
/// and promoted). gemm_dot<Model>(a, b) is one output of it for vectors of any length.
///
///     xt::xarray<float8_e4m3fn> a = ...;  // M x K
///     xt::xarray<float8_e4m3fn> b = ...;  // K x N
///     xt::xarray<float> d = tensor_core::gemm<tensor_core::h100_cublaslt_fp8>(a, b);
///
/// Speed: under the H100 rules (fp8 pairs, f16, and bf16 data whose exponents keep every result in
/// float32's normal range), products are integers, alignment is a shift and every step runs
/// across 32 outputs at once in integer lanes the compiler vectorises; outputs are shared among
/// OpenMP threads when the including program is compiled with OpenMP (as Eigen's GEMM does),
/// otherwise one thread. Everything else (other rules, bf16 data out of that range, the outputs
/// a NaN or inf code reaches) runs the reference engine of dot.hpp per output.
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
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

namespace scalify::tensor_core {

namespace detail {

/// One output of Model's GEMM: a[0..k) . b[0..k), both contiguous.
template <GemmModel Model, class TA, class TB>
[[nodiscard]] float chain_reference(const TA* a, const TB* b, std::size_t k) noexcept
{
    using instruction = typename Model::instruction;
    constexpr std::size_t step = instruction::k;
    constexpr std::size_t interval = Model::promotion_interval;
    float total = 0.0f;
    float partial = 0.0f;
    std::size_t in_group = 0;
    for (std::size_t s = 0; s < k; s += step) {
        partial = inner_product<instruction>(a + s, b + s, std::min(step, k - s), partial);
        if (interval != 0 && ++in_group == interval) {
            total += partial;  // round to nearest even, as the promotion's float32 add
            partial = 0.0f;
            in_group = 0;
        }
    }
    if constexpr (interval == 0) return partial;
    else return in_group != 0 ? total + partial : total;
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

/// Whether, and with which integer and float types, Instruction's chains over TA x TB run in
/// lanes. The lanes compute exactly what inner_product does when: the rules are the H100's (every
/// cut toward zero, nominal exponents); products need no right shift at emax; the exact sum fits
/// the lane integer (`usable`); and no result can leave float32's normal range, so that the
/// chained accumulator is always zero or a normal float: every nonzero result is at least
/// 2^(smallest product exponent - F), and a chain's sum stays below K times the largest product.
/// `always_in_range` says the formats guarantee it (fp8, f16); otherwise (bf16) `in_range` checks
/// the data's exponents at run time and out-of-range data run the reference engine.
template <InnerProductModel Instruction, class TA, class TB>
struct lane_plan {
    using rules = typename Instruction::rules;
    using fa = format_of<TA>;
    using fb = format_of<TB>;
    static constexpr int F = Instruction::alignment_bits;
    static constexpr int P = Instruction::result_bits;
    /// Left shift that puts a product's integer significand into units of 2^(e_a + e_b - F).
    static constexpr int product_shift = F - fa::mantissa_bits - fb::mantissa_bits;
    /// The float32 accumulator's significand into units of 2^(e_c - F).
    static constexpr int c_left = F > 23 ? F - 23 : 0;
    static constexpr int c_right = F < 23 ? 23 - F : 0;
    static constexpr int bits = sum_bits<Instruction>;
    static constexpr bool usable = rules::exponent == product_exponent::nominal &&
                                   rules::alignment == rounding_mode::toward_zero &&
                                   rules::normalisation == rounding_mode::toward_zero && product_shift >= 0 &&
                                   bits <= 52;
    /// Operands with exponents in [min_a, max_a] and [min_b, max_b], chains of k products.
    [[nodiscard]] static constexpr bool in_range(int min_a, int max_a, int min_b, int max_b, std::size_t k) noexcept
    {
        return min_a + min_b - F >= -126 && max_a + max_b + 2 + std::bit_width(k) <= 126;
    }
    static constexpr bool always_in_range =
        in_range(min_exponent<fa>, max_exponent<fa>, min_exponent<fb>, max_exponent<fb>, ~std::size_t{0});
    /// Integer lanes for the exact sum, and the float type that converts it exactly.
    using lane = std::conditional_t<(bits <= 30), std::int32_t, std::int64_t>;
    using wide = std::conditional_t<(bits <= 24), float, double>;
    using wide_bits = std::conditional_t<std::same_as<wide, float>, std::uint32_t, std::uint64_t>;
    static constexpr int wide_mantissa = std::same_as<wide, float> ? 23 : 52;
    static constexpr int wide_bias = std::same_as<wide, float> ? 127 : 1023;
    /// Clears the bits below the P-th significant bit of a normal `wide`: the cut toward zero.
    static constexpr wide_bits result_mask = ~((wide_bits{1} << (wide_mantissa + 1 - P)) - 1);
    /// One aligned product: below 2^(F + 2) units, so 16 bits hold it when F <= 13 (QGMMA), and
    /// 32 terms of 16 bits fill a vector twice as wide as 32-bit lanes would. Exponents and shift
    /// counts then take 16 bits as well (they stay within +-2^14).
    using term = std::conditional_t<(F + 2 <= 15 && std::same_as<lane, std::int32_t>), std::int16_t, lane>;
    using term_magnitude = std::make_unsigned_t<term>;
    using exponent = term;
    static constexpr term max_shift = static_cast<term>(sizeof(term) * 8 - 1);
    static constexpr lane max_c_shift = static_cast<lane>(sizeof(lane) * 8 - 1);
    /// Exponent of a zero operand: every sum with it lies below any real product's exponent.
    static constexpr int zero_exponent = -4096;
};

inline constexpr std::size_t lane_width = 32;

/// An operand as the lanes read it: signed integer significand (B's pre-shifted by
/// product_shift) and nominal exponent, both small enough for 16 bits where they can be, so that
/// a K x 32 panel of B stays in cache. Zeros and non-finite codes read as significand 0 with
/// exponent zero_exponent; `special` marks the non-finite ones.
template <class Plan, EncodedFloat T, int Shift>
struct lane_operand {
    static constexpr std::int64_t largest = ((std::int64_t{1} << (format_of<T>::mantissa_bits + 1)) - 1) << Shift;
    using significand_type = std::conditional_t<(largest < (1 << 15)), std::int16_t, std::int32_t>;
    using exponent_type = std::int16_t;
    significand_type significand;
    exponent_type exponent;
    bool special;

    [[nodiscard]] static constexpr lane_operand decode(unsigned code) noexcept
    {
        const operand d = decompose_code<format_of<T>>(code);
        if (d.what != operand::kind::finite) {
            return {0, static_cast<exponent_type>(Plan::zero_exponent), d.what != operand::kind::zero};
        }
        const auto magnitude = static_cast<significand_type>(static_cast<std::int32_t>(d.significand) << Shift);
        return {static_cast<significand_type>(d.negative ? -magnitude : magnitude), static_cast<exponent_type>(d.exponent),
                false};
    }
};

/// Every code of an 8-bit format decoded at compile time.
template <class Operand, EncodedFloat T>
inline constexpr auto lane_table = [] {
    std::array<Operand, 256> table{};
    for (unsigned code = 0; code < table.size(); ++code) table[code] = Operand::decode(code);
    return table;
}();

template <class Operand, EncodedFloat T>
[[nodiscard]] Operand lane_decode(const T& x) noexcept
{
    if constexpr (format_of<T>::total_bits <= 8) return lane_table<Operand, T>[code_of(x)];
    else return Operand::decode(code_of(x));
}

/// One row of A against one block of columns: the whole chain along K, lane by lane.
template <GemmModel Model, class Plan, class SA, class SB, class E>
void lane_chain(const SA* a_sig, const E* a_exp, const SB* b_sig, const E* b_exp, std::size_t k, float* out,
                std::size_t columns)
{
    using lane = typename Plan::lane;
    using wide = typename Plan::wide;
    using wide_bits = typename Plan::wide_bits;
    using term_magnitude = typename Plan::term_magnitude;
    constexpr std::size_t W = lane_width;
    constexpr std::size_t step = Model::instruction::k;
    constexpr std::size_t interval = Model::promotion_interval;
    constexpr int F = Plan::F;

    using term = typename Plan::term;
    using exponent = typename Plan::exponent;
    alignas(64) std::array<float, W> c{};
    alignas(64) std::array<float, W> total{};
    alignas(64) std::array<lane, W> sum{}, c_sig{}, c_exp{};
    alignas(64) std::array<exponent, W> emax{};
    std::size_t in_group = 0;
    for (std::size_t s = 0; s < k; s += step) {
        const std::size_t end = std::min(s + step, k);
        // The accumulator: zero or a normal float (gemm_lanes runs only data in range).
        for (std::size_t j = 0; j < W; ++j) {
            const auto bits = std::bit_cast<std::uint32_t>(c[j]);
            const bool zero = (bits & 0x7fffffffu) == 0;
            const auto magnitude = static_cast<lane>((bits & 0x7fffffu) | 0x800000u);
            c_sig[j] = zero ? lane{0} : ((bits >> 31) != 0 ? -magnitude : magnitude);
            c_exp[j] = zero ? lane{Plan::zero_exponent} : static_cast<lane>(static_cast<int>((bits >> 23) & 0xffu) - 127);
            emax[j] = static_cast<exponent>(c_exp[j]);
        }
        for (std::size_t kk = s; kk < end; ++kk) {
            const exponent ea = a_exp[kk];
            const E* eb = b_exp + kk * W;
            for (std::size_t j = 0; j < W; ++j) emax[j] = std::max(emax[j], static_cast<exponent>(ea + eb[j]));
        }
        // Cut toward zero: shift the magnitude, then restore the sign.
        for (std::size_t j = 0; j < W; ++j) {
            const lane shift = std::min(static_cast<lane>(emax[j] - c_exp[j] + Plan::c_right), Plan::max_c_shift);
            const lane magnitude = (std::abs(c_sig[j]) << Plan::c_left) >> shift;
            sum[j] = c_sig[j] < 0 ? -magnitude : magnitude;
        }
        for (std::size_t kk = s; kk < end; ++kk) {
            const exponent ea = a_exp[kk];
            const term sa = static_cast<term>(a_sig[kk]);
            const E* eb = b_exp + kk * W;
            const SB* sb = b_sig + kk * W;
            for (std::size_t j = 0; j < W; ++j) {
                // emax >= every exponent, so the count is never negative; an unsigned count of the
                // term's width lets the compiler shift 16-bit lanes (vpsrlvw) instead of widening.
                const auto shift = static_cast<term_magnitude>(
                    std::min(static_cast<exponent>(emax[j] - ea - eb[j]), Plan::max_shift));
                const auto product = static_cast<term>(sa * static_cast<term>(sb[j]));
                const auto magnitude = static_cast<term_magnitude>(
                    static_cast<term_magnitude>(product < 0 ? -product : product) >> shift);
                sum[j] += static_cast<term>(product < 0 ? -magnitude : magnitude);
            }
        }
        // Normalise: the exact sum converts exactly to `wide`; masking its significand cuts it
        // to P bits toward zero; scaling by 2^(emax - F) is exact.
        for (std::size_t j = 0; j < W; ++j) {
            const wide exact = static_cast<wide>(sum[j]);
            const wide cut = std::bit_cast<wide>(static_cast<wide_bits>(std::bit_cast<wide_bits>(exact) & Plan::result_mask));
            const lane e = std::max(static_cast<lane>(emax[j]), static_cast<lane>(F - 126));  // all-zero lanes: any scale
            const auto scale = std::bit_cast<wide>(static_cast<wide_bits>(static_cast<wide_bits>(e - F + Plan::wide_bias)
                                                                          << Plan::wide_mantissa));
            c[j] = static_cast<float>(cut * scale);
        }
        if constexpr (interval != 0) {
            if (++in_group == interval) {
                for (std::size_t j = 0; j < W; ++j) total[j] += c[j];
                c.fill(0.0f);
                in_group = 0;
            }
        }
    }
    if constexpr (interval != 0) {
        if (in_group != 0)
            for (std::size_t j = 0; j < W; ++j) total[j] += c[j];
        std::copy_n(total.begin(), columns, out);
    } else {
        std::copy_n(c.begin(), columns, out);
    }
}

/// Model's GEMM in lanes; false (nothing written) when the data's exponents are out of range.
template <GemmModel Model, class TA, class TB>
[[nodiscard]] bool gemm_lanes(const TA* a, const TB* b, std::size_t m, std::size_t k, std::size_t n, float* out)
{
    using Plan = lane_plan<typename Model::instruction, TA, TB>;
    using operand_a = lane_operand<Plan, TA, 0>;
    using operand_b = lane_operand<Plan, TB, Plan::product_shift>;
    using exponent_type = typename operand_a::exponent_type;
    constexpr std::size_t W = lane_width;
    const std::size_t blocks = (n + W - 1) / W;

    // Decoded panels in per-thread buffers that only grow: fresh pages cost more than the decode.
    thread_local std::vector<typename operand_a::significand_type> a_sig;
    thread_local std::vector<typename operand_b::significand_type> b_sig;
    thread_local std::vector<exponent_type> a_exp, b_exp;
    thread_local std::vector<unsigned char> special_row, special_column;
    // Exponent ranges of the nonzero finite operands, where the formats do not bound them enough.
    int min_a = 1 << 14, max_a = -(1 << 14), min_b = 1 << 14, max_b = -(1 << 14);
    const auto track = [](const auto& x, int& lo, int& hi) {
        if constexpr (!Plan::always_in_range) {
            if (x.significand != 0) {
                lo = std::min(lo, static_cast<int>(x.exponent));
                hi = std::max(hi, static_cast<int>(x.exponent));
            }
        }
    };
    a_sig.resize(m * k);
    a_exp.resize(m * k);
    special_row.assign(m, 0);
    for (std::size_t i = 0; i < m; ++i) {
        bool special = false;
        for (std::size_t p = i * k; p < (i + 1) * k; ++p) {
            const auto x = lane_decode<operand_a>(a[p]);
            a_sig[p] = x.significand;
            a_exp[p] = x.exponent;
            special = special || x.special;
            track(x, min_a, max_a);
        }
        special_row[i] = special ? 1 : 0;
    }
    // B in blocks of W columns, each block K rows of W; columns past N read as zeros.
    b_sig.resize(blocks * k * W);
    b_exp.resize(blocks * k * W);
    special_column.assign(n, 0);
    for (std::size_t block = 0; block < blocks; ++block) {
        const std::size_t j0 = block * W, width = std::min(W, n - j0);
        for (std::size_t p = 0; p < k; ++p) {
            const std::size_t at = (block * k + p) * W;
            for (std::size_t j = 0; j < width; ++j) {
                const auto x = lane_decode<operand_b>(b[p * n + j0 + j]);
                b_sig[at + j] = x.significand;
                b_exp[at + j] = x.exponent;
                special_column[j0 + j] |= x.special ? 1 : 0;
                track(x, min_b, max_b);
            }
            for (std::size_t j = width; j < W; ++j) {
                b_sig[at + j] = 0;
                b_exp[at + j] = static_cast<exponent_type>(Plan::zero_exponent);
            }
        }
    }

    if constexpr (!Plan::always_in_range) {
        const bool some_zero_operand = min_a > max_a || min_b > max_b;  // every product is zero
        if (!some_zero_operand && !Plan::in_range(min_a, max_a, min_b, max_b, k)) return false;
    }

    // Pointers, not the thread_local names: inside the loop those would be each worker's own.
    const auto* as = a_sig.data();
    const auto* ae = a_exp.data();
    const auto* bs = b_sig.data();
    const auto* be = b_exp.data();
    scalify::detail::parallel_for(blocks * m, [=](std::size_t task) {
        const std::size_t block = task / m, i = task % m;
        const std::size_t j0 = block * W;
        lane_chain<Model, Plan>(as + i * k, ae + i * k, bs + block * k * W, be + block * k * W, k, out + i * n + j0,
                                std::min(W, n - j0));
    });

    // NaN and inf codes: the outputs they reach, again through the reference engine.
    const bool any_row = std::find(special_row.begin(), special_row.end(), 1) != special_row.end();
    const bool any_column = std::find(special_column.begin(), special_column.end(), 1) != special_column.end();
    if (!any_row && !any_column) return true;
    std::vector<TB> column(k);
    for (std::size_t j = 0; j < n; ++j) {
        const bool whole_column = special_column[j] != 0;
        if (!whole_column && !any_row) continue;
        for (std::size_t p = 0; p < k; ++p) column[p] = b[p * n + j];
        for (std::size_t i = 0; i < m; ++i) {
            if (whole_column || special_row[i]) out[i * n + j] = chain_reference<Model>(a + i * k, column.data(), k);
        }
    }
    return true;
}

template <GemmModel Model, class TA, class TB>
void gemm_reference(const TA* a, const TB* b, std::size_t m, std::size_t k, std::size_t n, float* out)
{
    std::vector<TB> bt(n * k);  // B transposed: each output's column contiguous
    for (std::size_t p = 0; p < k; ++p)
        for (std::size_t j = 0; j < n; ++j) bt[j * k + p] = b[p * n + j];
    scalify::detail::parallel_for(m * n, [&](std::size_t i) { out[i] = chain_reference<Model>(a + (i / n) * k, bt.data() + (i % n) * k, k); });
}

/// out (M x N, row-major) = gemm<Model>(a (M x K), b (K x N)), both row-major and contiguous.
template <GemmModel Model, class TA, class TB>
void gemm_into(const TA* a, const TB* b, std::size_t m, std::size_t k, std::size_t n, float* out)
{
    if (m == 0 || n == 0) return;
    if (k == 0) {
        std::fill_n(out, m * n, 0.0f);
        return;
    }
    if constexpr (lane_plan<typename Model::instruction, TA, TB>::usable) {
        if (gemm_lanes<Model>(a, b, m, k, n, out)) return;
    }
    gemm_reference<Model>(a, b, m, k, n, out);
}

template <GemmModel Model, class TA, class TB>
constexpr void check_operands() noexcept
{
    static_assert(Model::instruction::template takes<TA, TB>,
                  "this GEMM model's instruction does not take these operand types (h100_cublaslt_fp8 and "
                  "h100_cublaslt_fp8_fast: float8_e4m3fn/float8_e5m2 in any pair; h100_hmma_chain: "
                  "Eigen::half x Eigen::half or Eigen::bfloat16 x Eigen::bfloat16)");
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
    return detail::chain_reference<Model>(a.data(), b.data(), a.size());
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
