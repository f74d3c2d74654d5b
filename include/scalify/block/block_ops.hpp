#pragma once
/// \file block_ops.hpp
/// What block-scaled arrays support beyond value()/dequantize(): matmul (the MX way: block
/// partial products accumulated in float32 and scaled, result a per-tensor float ScaledArray),
/// packed fp4 storage, and a clear compile-time refusal from every other primitive.

#include <scalify/block/block_scaled_array.hpp>
#include <scalify/ops/matmul.hpp>

#include <scalify/detail/eigen_core.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace scalify {

namespace detail {

/// Row-major float copy of a's value (data times its block's scale), a block run at a time.
template <class T, class S>
void decode_scaled(const BlockScaledArray<T, S>& a, float* out)
{
    const std::size_t rows = a.shape()[0], cols = a.shape()[1];
    const T* in = a.data().data();
    for (std::size_t i = 0; i < rows; ++i) {
        const std::size_t scale_row = i / a.block_rows();
        for (std::size_t c0 = 0; c0 < cols; c0 += a.block_cols()) {
            const float s = static_cast<float>(a.scales()(scale_row, c0 / a.block_cols()));
            const std::size_t c1 = std::min(cols, c0 + a.block_cols());
            const T* row_in = in + i * cols;
            float* row_out = out + i * cols;
            for (std::size_t c = c0; c < c1; ++c) row_out[c] = static_cast<float>(load(row_in[c])) * s;
        }
    }
}

}  // namespace detail

/// a (M x K) times b (K x N), both block-scaled with the same block extent along K
/// (a.block_cols() == b.block_rows()); any blocking along M and N. With E8M0 (power-of-two)
/// scales each element is scaled exactly before one float32 GEMM, which equals scaling each
/// block's partial sum up to float32 summation order; with float32 scales every K-block is its
/// own GEMM whose partial products are scaled and accumulated, as MX hardware defines it.
template <class A, class SA, class B, class SB>
[[nodiscard]] ScaledArray<float, float_scale> matmul(const BlockScaledArray<A, SA>& a, const BlockScaledArray<B, SB>& b)
{
    const std::size_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
    if (b.shape()[0] != k) {
        SCALIFY_THROW(shape_error(fmt::format("matmul: shapes {} and {} do not multiply (need (M, K) and (K, N))",
                                              shape_string(a.shape()), shape_string(b.shape()))));
    }
    if (a.block_cols() != b.block_rows()) {
        // The usual cause: both operands quantised along the same axis. a's K runs along its
        // columns (blocks along axis 1), b's along its rows (blocks along axis 0).
        SCALIFY_THROW(shape_error(fmt::format(
            "matmul: a's blocks ({}x{}) span {} along K (a's columns) but b's ({}x{}) span {} along K (b's rows); "
            "quantise a along axis 1 and b along axis 0 with the same block size",
            a.block_rows(), a.block_cols(), a.block_cols(), b.block_rows(), b.block_cols(), b.block_rows())));
    }
    using matrix = detail::row_major_matrix<float>;
    xt::xarray<float> out = xt::xarray<float>::from_shape({m, n});
    constexpr bool pow2_scales = std::same_as<SA, float8_e8m0fnu> && std::same_as<SB, float8_e8m0fnu>;
    if constexpr (pow2_scales) {
        thread_local matrix a_panel, b_panel;
        a_panel.resize(static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(k));
        b_panel.resize(static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(n));
        detail::decode_scaled(a, a_panel.data());
        detail::decode_scaled(b, b_panel.data());
        detail::gemm_any_thread_count<float, false, false>(a_panel.data(), b_panel.data(), m, k, n, out.data(), 1.0f);
    } else {
        thread_local matrix a_panel, b_panel, partial;
        partial.resize(static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(n));
        a_panel.resize(static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(k));
        b_panel.resize(static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(n));
        for (std::size_t i = 0; i < m * k; ++i) a_panel.data()[i] = static_cast<float>(detail::load(a.data().data()[i]));
        for (std::size_t i = 0; i < k * n; ++i) b_panel.data()[i] = static_cast<float>(detail::load(b.data().data()[i]));
        Eigen::Map<matrix> c(out.data(), static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(n));
        c.setZero();
        const std::size_t block = a.block_cols();
        for (std::size_t k0 = 0; k0 < k; k0 += block) {
            const std::size_t len = std::min(block, k - k0);
            // partial = a's columns [k0, k0 + len) times b's rows [k0, k0 + len)
            detail::gemm_any_thread_count<float, false, false>(a_panel.data() + k0, k, b_panel.data() + k0 * n, n, m, len, n,
                                                               partial.data(), 1.0f, false);
            const std::size_t kb = k0 / block;
            for (std::size_t i = 0; i < m; ++i) {
                const float sa = static_cast<float>(a.scales()(i / a.block_rows(), kb));
                for (std::size_t j = 0; j < n; ++j) {
                    c(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) +=
                        partial(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) * (sa * static_cast<float>(b.scales()(kb, j / b.block_cols())));
                }
            }
        }
    }
    return ScaledArray<float, float_scale>(std::move(out), 1.0f);
}

/// float4_e2m1fn codes packed two per byte (element 2i in the low nibble, 2i + 1 in the high one).
struct packed_fp4 {
    std::vector<std::uint8_t> bytes;
    std::size_t count = 0;  ///< elements
};

[[nodiscard]] inline packed_fp4 pack_fp4(std::span<const float4_e2m1fn> values)
{
    packed_fp4 packed{std::vector<std::uint8_t>((values.size() + 1) / 2, 0), values.size()};
    for (std::size_t i = 0; i < values.size(); ++i) {
        const auto code = static_cast<std::uint8_t>(values[i].bits() & 0x0f);
        packed.bytes[i / 2] = static_cast<std::uint8_t>(packed.bytes[i / 2] | (i % 2 ? code << 4 : code));
    }
    return packed;
}

/// shape_error if the byte count does not hold `count` elements.
[[nodiscard]] inline std::vector<float4_e2m1fn> unpack_fp4(const packed_fp4& packed)
{
    if (packed.bytes.size() != (packed.count + 1) / 2) {
        SCALIFY_THROW(shape_error(fmt::format("unpack_fp4: {} bytes cannot hold {} elements (need {})", packed.bytes.size(),
                                              packed.count, (packed.count + 1) / 2)));
    }
    std::vector<float4_e2m1fn> out(packed.count);
    for (std::size_t i = 0; i < packed.count; ++i) {
        const unsigned byte = packed.bytes[i / 2];
        out[i] = float4_e2m1fn::from_bits(static_cast<std::uint8_t>(i % 2 ? byte >> 4 : byte & 0x0f));
    }
    return out;
}

namespace detail {
template <class... Args>
inline constexpr bool any_block_scaled_v = (is_block_scaled_v<std::remove_cvref_t<Args>> || ...);
template <class... Args>
inline constexpr bool dependent_false_v = false;
}  // namespace detail

// Every other primitive needs per-tensor operands: a block-scaled argument is refused at compile
// time with a sentence instead of an overload-resolution listing.
#define SCALIFY_PER_TENSOR_ONLY(name)                                                                                      \
    template <class... Strategy, class... Args>                                                                            \
        requires detail::any_block_scaled_v<Args...>                                                                       \
    void name(const Args&...)                                                                                              \
    {                                                                                                                      \
        static_assert(detail::dependent_false_v<Args...>,                                                                  \
                      "scalify::" #name " needs per-tensor ScaledArray operands; a BlockScaledArray supports value(), "   \
                      "dequantize() and matmul(): dequantize() it first");                                                 \
    }
SCALIFY_PER_TENSOR_ONLY(add)
SCALIFY_PER_TENSOR_ONLY(sub)
SCALIFY_PER_TENSOR_ONLY(mul)
SCALIFY_PER_TENSOR_ONLY(div)
SCALIFY_PER_TENSOR_ONLY(maximum)
SCALIFY_PER_TENSOR_ONLY(minimum)
SCALIFY_PER_TENSOR_ONLY(neg)
SCALIFY_PER_TENSOR_ONLY(abs)
SCALIFY_PER_TENSOR_ONLY(relu)
SCALIFY_PER_TENSOR_ONLY(gelu)
SCALIFY_PER_TENSOR_ONLY(exp)
SCALIFY_PER_TENSOR_ONLY(log)
SCALIFY_PER_TENSOR_ONLY(sqrt)
SCALIFY_PER_TENSOR_ONLY(softmax)
SCALIFY_PER_TENSOR_ONLY(reduce_sum)
SCALIFY_PER_TENSOR_ONLY(reduce_max)
SCALIFY_PER_TENSOR_ONLY(transpose)
SCALIFY_PER_TENSOR_ONLY(reshape)
SCALIFY_PER_TENSOR_ONLY(rebalance_scale)
#undef SCALIFY_PER_TENSOR_ONLY

}  // namespace scalify
