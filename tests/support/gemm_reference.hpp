#pragma once
// A tensor-core GEMM against its reference chain, output by output: gemm_dot<Model> over row i of
// A and column j of B, the chain every engine (lanes, fallbacks, threads) must reproduce.

#include <scalify/tensor_core.hpp>

#include <xtensor/xarray.hpp>

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace scalify::testing {

/// The value of element type T whose bit pattern is `code` (its low 8 or 16 bits for the narrow
/// types; all 32 for float).
template <class T>
T from_code(std::uint32_t code)
{
    if constexpr (std::same_as<T, float>) return std::bit_cast<float>(code);
    else return float_traits<T>::from_bits(static_cast<typename float_traits<T>::format::storage_type>(code));
}

/// Output bits that agree: a NaN matches any NaN (an engine and the reference chain may differ in
/// a NaN's payload); otherwise the bits.
inline bool same_result(std::uint32_t got, std::uint32_t want)
{
    const bool got_nan = (got & 0x7fffffffu) > 0x7f800000u, want_nan = (want & 0x7fffffffu) > 0x7f800000u;
    return got_nan || want_nan ? got_nan == want_nan : got == want;
}

/// Row i of a (M x K).
template <class T>
std::vector<T> row_of(const xt::xarray<T>& a, std::size_t i)
{
    std::vector<T> row(a.shape()[1]);
    for (std::size_t p = 0; p < row.size(); ++p) row[p] = a(i, p);
    return row;
}

/// Column j of b (K x N).
template <class T>
std::vector<T> column_of(const xt::xarray<T>& b, std::size_t j)
{
    std::vector<T> column(b.shape()[0]);
    for (std::size_t p = 0; p < column.size(); ++p) column[p] = b(p, j);
    return column;
}

/// How many outputs d(i, j) of Model's GEMM of a and b agree with gemm_dot<Model>(row i of a,
/// column j of b): `agree(got bits, reference bits)`, bit equality unless given.
template <class Model, class TA, class TB, class Agree = std::equal_to<std::uint32_t>>
std::size_t outputs_agreeing_with_gemm_dot(const xt::xarray<float>& d, const xt::xarray<TA>& a, const xt::xarray<TB>& b,
                                           Agree agree = {})
{
    const std::size_t m = a.shape()[0], n = b.shape()[1];
    std::vector<std::vector<TB>> columns;
    for (std::size_t j = 0; j < n; ++j) columns.push_back(column_of(b, j));
    std::size_t agreeing = 0;
    for (std::size_t i = 0; i < m; ++i) {
        const std::vector<TA> row = row_of(a, i);
        for (std::size_t j = 0; j < n; ++j) {
            const float want = tensor_core::gemm_dot<Model>(row, columns[j]);
            agreeing += agree(std::bit_cast<std::uint32_t>(d(i, j)), std::bit_cast<std::uint32_t>(want)) ? 1 : 0;
        }
    }
    return agreeing;
}

}  // namespace scalify::testing
