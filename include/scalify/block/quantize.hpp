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

#include <algorithm>
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
    xt::xarray<Element> data = xt::xarray<Element>::from_shape({g.rows, g.cols});
    xt::xarray<ScaleT> scales = xt::xarray<ScaleT>::from_shape({g.scale_rows, g.scale_cols});
    const float* in = x.data();
    Element* out = data.data();
    for (std::size_t br = 0; br < g.scale_rows; ++br) {
        const std::size_t r0 = br * g.block_rows, r1 = std::min(g.rows, r0 + g.block_rows);
        for (std::size_t bc = 0; bc < g.scale_cols; ++bc) {
            const std::size_t c0 = bc * g.block_cols, c1 = std::min(g.cols, c0 + g.block_cols);
            float amax = 0.0f;
            bool special = false;
            for (std::size_t r = r0; r < r1; ++r) {
                for (std::size_t c = c0; c < c1; ++c) {
                    const float m = std::abs(in[r * g.cols + c]);
                    special = special || !(m <= std::numeric_limits<float>::max());  // NaN or inf
                    amax = m > amax ? m : amax;
                }
            }
            const auto [stored, multiplier] = scale_of(special ? std::numeric_limits<float>::quiet_NaN() : amax);
            scales(br, bc) = stored;
            for (std::size_t r = r0; r < r1; ++r) {
                const float* row_in = in + r * g.cols;
                Element* row_out = out + r * g.cols;
                for (std::size_t c = c0; c < c1; ++c) {
                    row_out[c] = convert<Element, round_nearest_even, saturate_finite>(row_in[c] * multiplier);
                }
            }
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
            exponent = rule == mx_scale_rule::floor
                           ? std::ilogb(amax) - emax
                           : static_cast<int>(std::ceil(std::log2(static_cast<double>(amax) / element_max)));
            exponent = std::clamp(exponent, -127, 127);
        }
        return detail::scale_pair_e8m0{float8_e8m0fnu::from_bits(static_cast<std::uint8_t>(exponent + 127)),
                                       static_cast<float>(std::ldexp(1.0, -exponent))};
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
