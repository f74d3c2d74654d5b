#pragma once
/// \file block_scaled_array.hpp
/// Finer scales for matrices: BlockScaledArray<T, ScaleT> holds 2-D data and one scale per block
/// of block_rows x block_cols elements, so one type covers
///   per-axis (torchao "axiswise", one scale per row: blocks 1 x N),
///   OCP Microscaling (MXFP8/6/4: blocks 1 x 32 along K, E8M0 scales),
///   TransformerEngine 1 x 128 and 128 x 128 blocks (float32 scales),
/// and per-tensor (one block). value() broadcasts each scale over its block. Edge blocks may be
/// partial: an axis that the block size does not divide is covered by a last, shorter block
/// (no padding is stored).
///
///     auto a = quantize_mx<float8_e4m3fn>(x, 1);           // MXFP8, 32-element blocks along rows
///     auto c = matmul(a, quantize_mx<float8_e4m3fn>(w, 0)); // per-tensor float result

#include <scalify/error.hpp>
#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstddef>

namespace scalify {

/// A type a block scale may have: float, or an exponent-only format (float8_e8m0fnu) as MX uses.
template <class S>
concept BlockScaleType = std::same_as<S, float> || std::same_as<S, float8_e8m0fnu>;

template <ScaledElement T, BlockScaleType ScaleT = float>
class BlockScaledArray {
public:
    using value_type = T;
    using scale_type = ScaleT;

    /// data (M x N), scales (ceil(M / block_rows) x ceil(N / block_cols)); shape_error otherwise.
    BlockScaledArray(xt::xarray<T> data, xt::xarray<ScaleT> scales, std::size_t block_rows, std::size_t block_cols)
        : m_data(std::move(data)), m_scales(std::move(scales)), m_block_rows(block_rows), m_block_cols(block_cols)
    {
        if (m_data.dimension() != 2) {
            SCALIFY_THROW(shape_error(fmt::format("BlockScaledArray: data must be 2-D, got shape {}", shape_string(m_data.shape()))));
        }
        if (block_rows == 0 || block_cols == 0) {
            SCALIFY_THROW(shape_error(fmt::format("BlockScaledArray: block {}x{} has a zero extent", block_rows, block_cols)));
        }
        const std::size_t want_rows = (m_data.shape()[0] + block_rows - 1) / block_rows;
        const std::size_t want_cols = (m_data.shape()[1] + block_cols - 1) / block_cols;
        if (m_scales.dimension() != 2 || m_scales.shape()[0] != want_rows || m_scales.shape()[1] != want_cols) {
            SCALIFY_THROW(shape_error(fmt::format("BlockScaledArray: scales of shape {} do not match data {} in {}x{} blocks (need ({}, {}))",
                                                  shape_string(m_scales.shape()), shape_string(m_data.shape()), block_rows,
                                                  block_cols, want_rows, want_cols)));
        }
    }

    [[nodiscard]] const xt::xarray<T>& data() const noexcept { return m_data; }
    [[nodiscard]] const xt::xarray<ScaleT>& scales() const noexcept { return m_scales; }
    [[nodiscard]] std::size_t block_rows() const noexcept { return m_block_rows; }
    [[nodiscard]] std::size_t block_cols() const noexcept { return m_block_cols; }
    [[nodiscard]] const auto& shape() const noexcept { return m_data.shape(); }
    [[nodiscard]] std::size_t size() const noexcept { return m_data.size(); }

    /// Scale of element (i, j) as a float (an E8M0 NaN scale gives NaN).
    [[nodiscard]] float scale_at(std::size_t i, std::size_t j) const
    {
        return static_cast<float>(m_scales(i / m_block_rows, j / m_block_cols));
    }

    /// data * (its block's scale), in float.
    [[nodiscard]] xt::xarray<float> value() const
    {
        const std::size_t rows = m_data.shape()[0], cols = m_data.shape()[1];
        xt::xarray<float> out = xt::xarray<float>::from_shape({rows, cols});
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) out(i, j) = static_cast<float>(detail::load(m_data(i, j))) * scale_at(i, j);
        return out;
    }

private:
    xt::xarray<T> m_data;
    xt::xarray<ScaleT> m_scales;
    std::size_t m_block_rows;
    std::size_t m_block_cols;
};

template <class A>
inline constexpr bool is_block_scaled_v = false;
template <class T, class S>
inline constexpr bool is_block_scaled_v<BlockScaledArray<T, S>> = true;

/// The value as a per-tensor ScaledArray (float data, scale 1).
template <class T, class S>
[[nodiscard]] ScaledArray<float, float_scale> dequantize(const BlockScaledArray<T, S>& a)
{
    return ScaledArray<float, float_scale>(a.value(), 1.0f);
}

}  // namespace scalify
