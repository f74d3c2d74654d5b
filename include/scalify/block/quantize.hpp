#pragma once
/// \file quantize.hpp
/// Block quantisers into BlockScaledArray:
/// - quantize_mx<Element>(x, axis, block = 32, rule): OCP Microscaling, E8M0 shared scales;
///     mx_scale_rule::floor (OCP spec / microxcaling): X = 2^(floor(log2 amax) - emax(Element)),
///       elements then saturate (the largest may exceed max(Element) by up to 2x before saturating);
///     mx_scale_rule::ceil (TransformerEngine / cuBLAS): X = 2^ceil(log2(amax / max(Element))),
///       no element overflows.
///   All-zero block: X = 2^-127 (the smallest E8M0 value; every element is 0). A NaN or inf in a
///   block: X = NaN (E8M0 0xff), so the whole block decodes to NaN, as the OCP spec prescribes.
/// - quantize_blocks<Element>(x, block_rows, block_cols): float32 scales amax / max(Element)
///   (TransformerEngine 1x128 and 128x128 blocks), all-zero block scale 1, non-finite amax NaN.
/// - quantize_axiswise<Element>(x, axis): one float32 scale per row (axis 1) or column (axis 0).
/// Elements are cast with nearest-even rounding and saturation (satfinite).

#include <scalify/block/block_scaled_array.hpp>
#include <scalify/strategy/non_finite.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <cstddef>
#include <limits>

namespace scalify {

enum class mx_scale_rule { floor, ceil };

namespace detail {

/// Largest power-of-two exponent not above max(Element): 448 -> 8, 57344 -> 15, 7.5 -> 2, 6 -> 2.
template <class Element>
[[nodiscard]] int element_emax() noexcept
{
    return std::ilogb(static_cast<float>(std::numeric_limits<Element>::max()));
}

struct block_geometry {
    std::size_t rows, cols, block_rows, block_cols, scale_rows, scale_cols;
};

[[nodiscard]] inline block_geometry plan_blocks(const char* op, const xt::xarray<float>& x, std::size_t block_rows,
                                                std::size_t block_cols)
{
    if (x.dimension() != 2) SCALIFY_THROW(shape_error(fmt::format("{}: input must be 2-D, got shape {}", op, shape_string(x.shape()))));
    if (block_rows == 0 || block_cols == 0) SCALIFY_THROW(shape_error(fmt::format("{}: block {}x{} has a zero extent", op, block_rows, block_cols)));
    const std::size_t rows = x.shape()[0], cols = x.shape()[1];
    return {rows, cols, block_rows, block_cols, (rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols};
}

/// For each block: amax (NaN if the block holds NaN or inf), then scale = rule(amax), then
/// elements = satfinite(x / scale). ScaleOf(amax) returns {stored scale, float multiplier 1/scale}.
template <class Element, class ScaleT, class ScaleOf>
[[nodiscard]] BlockScaledArray<Element, ScaleT> quantize_by_block(const xt::xarray<float>& x, const block_geometry& g, ScaleOf scale_of)
{
    if (checking_finite()) (void)summarize_for_scale("block quantisation", x.data(), x.size());
    xt::xarray<Element> data = xt::xarray<Element>::from_shape({g.rows, g.cols});
    xt::xarray<ScaleT> scales = xt::xarray<ScaleT>::from_shape({g.scale_rows, g.scale_cols});
    const float* in = x.data();
    Element* out = data.data();
    // One block's amax (as abs bits: branch-free, so it vectorises; NaN or inf show as >= inf's
    // bits) and its cast; Width > 0 fixes the run length at compile time (the MX 1 x 32 case).
    const auto amax_bits_of = [](const float* run, std::size_t length, std::uint32_t amax_bits) {
        for (std::size_t c = 0; c < length; ++c) {
            const std::uint32_t m = std::bit_cast<std::uint32_t>(run[c]) & 0x7fffffffu;
            amax_bits = m > amax_bits ? m : amax_bits;
        }
        return amax_bits;
    };
    const auto cast_run = [](const float* run, Element* run_out, std::size_t length, float multiplier) {
        for (std::size_t c = 0; c < length; ++c) {
            run_out[c] = convert<Element, round_nearest_even, saturate_finite>(run[c] * multiplier);
        }
    };
    const auto scale_for = [&](std::uint32_t amax_bits) {
        const bool special = amax_bits >= 0x7f800000u;
        return scale_of(special ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(amax_bits));
    };
    constexpr std::size_t mx_width = 32;
    if (g.block_rows == 1 && g.block_cols == mx_width) {
        for (std::size_t r = 0; r < g.rows; ++r) {
            const float* row_in = in + r * g.cols;
            Element* row_out = out + r * g.cols;
            std::size_t bc = 0;
            for (; (bc + 1) * mx_width <= g.cols; ++bc) {  // full blocks: fixed trip count
                const auto [stored, multiplier] = scale_for(amax_bits_of(row_in + bc * mx_width, mx_width, 0));
                scales(r, bc) = stored;
                cast_run(row_in + bc * mx_width, row_out + bc * mx_width, mx_width, multiplier);
            }
            if (bc * mx_width < g.cols) {  // the partial last block
                const std::size_t length = g.cols - bc * mx_width;
                const auto [stored, multiplier] = scale_for(amax_bits_of(row_in + bc * mx_width, length, 0));
                scales(r, bc) = stored;
                cast_run(row_in + bc * mx_width, row_out + bc * mx_width, length, multiplier);
            }
        }
        return BlockScaledArray<Element, ScaleT>(std::move(data), std::move(scales), g.block_rows, g.block_cols);
    }
    for (std::size_t br = 0; br < g.scale_rows; ++br) {
        const std::size_t r0 = br * g.block_rows, r1 = std::min(g.rows, r0 + g.block_rows);
        for (std::size_t bc = 0; bc < g.scale_cols; ++bc) {
            const std::size_t c0 = bc * g.block_cols, c1 = std::min(g.cols, c0 + g.block_cols);
            std::uint32_t amax_bits = 0;
            for (std::size_t r = r0; r < r1; ++r) amax_bits = amax_bits_of(in + r * g.cols + c0, c1 - c0, amax_bits);
            const auto [stored, multiplier] = scale_for(amax_bits);
            scales(br, bc) = stored;
            for (std::size_t r = r0; r < r1; ++r) cast_run(in + r * g.cols + c0, out + r * g.cols + c0, c1 - c0, multiplier);
        }
    }
    return BlockScaledArray<Element, ScaleT>(std::move(data), std::move(scales), g.block_rows, g.block_cols);
}

struct scale_pair_e8m0 {
    float8_e8m0fnu stored;
    float multiplier;
};
struct scale_pair_float {
    float stored;
    float multiplier;
};

}  // namespace detail

/// MX quantisation of a 2-D float array along `axis` (1: blocks of `block` consecutive elements
/// in a row, as for the left operand of a matmul; 0: down a column, for the right operand).
template <class Element>
[[nodiscard]] BlockScaledArray<Element, float8_e8m0fnu> quantize_mx(const xt::xarray<float>& x, std::size_t axis,
                                                                    std::size_t block = 32,
                                                                    mx_scale_rule rule = mx_scale_rule::floor)
{
    if (axis > 1) SCALIFY_THROW(shape_error(fmt::format("quantize_mx: axis {} out of range for a 2-D array", axis)));
    const auto g = detail::plan_blocks("quantize_mx", x, axis == 0 ? block : 1, axis == 1 ? block : 1);
    const int emax = detail::element_emax<Element>();
    const double element_max = static_cast<float>(std::numeric_limits<Element>::max());
    return detail::quantize_by_block<Element, float8_e8m0fnu>(x, g, [=](float amax) {
        if (std::isnan(amax)) return detail::scale_pair_e8m0{float8_e8m0fnu::from_bits(0xff), std::numeric_limits<float>::quiet_NaN()};
        int exponent = -127;
        if (amax > 0.0f) {
            // floor(log2 amax) from the bits for normal floats (no libm call per block).
            const auto bits = std::bit_cast<std::uint32_t>(amax);
            const int amax_exponent = bits >= 0x00800000u ? static_cast<int>(bits >> 23) - 127 : std::ilogb(amax);
            exponent = rule == mx_scale_rule::floor
                           ? amax_exponent - emax
                           : static_cast<int>(std::ceil(std::log2(static_cast<double>(amax) / element_max)));
            exponent = std::clamp(exponent, -127, 127);
        }
        // 2^-exponent, built from bits while it is a normal float.
        const float multiplier = exponent < 127 ? std::bit_cast<float>(static_cast<std::uint32_t>(127 - exponent) << 23)
                                                : std::ldexp(1.0f, -exponent);
        return detail::scale_pair_e8m0{float8_e8m0fnu::from_bits(static_cast<std::uint8_t>(exponent + 127)), multiplier};
    });
}

/// float32-scaled blocks: scale = amax / max(Element) (1 for an all-zero block, NaN for a block
/// holding NaN or inf).
template <class Element>
[[nodiscard]] BlockScaledArray<Element, float> quantize_blocks(const xt::xarray<float>& x, std::size_t block_rows,
                                                               std::size_t block_cols)
{
    const auto g = detail::plan_blocks("quantize_blocks", x, block_rows, block_cols);
    const float element_max = static_cast<float>(std::numeric_limits<Element>::max());
    return detail::quantize_by_block<Element, float>(x, g, [=](float amax) {
        if (std::isnan(amax)) return detail::scale_pair_float{amax, amax};
        if (amax == 0.0f) return detail::scale_pair_float{1.0f, 1.0f};
        const float scale = amax / element_max;
        return detail::scale_pair_float{scale, scale > 0.0f ? 1.0f / scale : 1.0f};
    });
}

/// One float32 scale per row (axis 1) or per column (axis 0).
template <class Element>
[[nodiscard]] BlockScaledArray<Element, float> quantize_axiswise(const xt::xarray<float>& x, std::size_t axis)
{
    if (axis > 1 || x.dimension() != 2) {
        SCALIFY_THROW(shape_error(fmt::format("quantize_axiswise: axis {} of an array of shape {}", axis, shape_string(x.shape()))));
    }
    return axis == 1 ? quantize_blocks<Element>(x, 1, std::max<std::size_t>(1, x.shape()[1]))
                     : quantize_blocks<Element>(x, std::max<std::size_t>(1, x.shape()[0]), 1);
}

}  // namespace scalify
