#pragma once
/// \file linear.hpp
/// linear(x, w, b) = x.w + b, a linear layer (PyTorch's addmm / F.linear with w stored (K, N)):
/// the bias rows are the GEMM's initial result (beta = 1), so the bias is added inside the
/// product's accumulation instead of in a pass of its own over the product. Its scale is the one
/// add(matmul(x, w), b) has (add's rule over matmul's scale and b's); its data round once where
/// the composition rounds twice (docs/ops.md). Where the bias cannot enter the GEMM (a dynamic
/// (amax) strategy, a tensor-core accumulation model, a narrow result type, a bias that is not a
/// row of N, a single-element result) it is add(matmul(x, w), b), with those bits.
///
///     auto h = linear<unit_scaling>(x, w, b);   // x (..., K), w (K, N), b (N): h (..., N)
/// Backward: matmul_vjp's products and add_vjp's sum of the cotangent over the rows.

#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/matmul.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

namespace scalify {

namespace detail {

/// The result type and policy of linear(x, w, b): those of add(matmul(x, w), b).
template <class A, class PA, class B, class PB, class T, class PT>
using linear_result_t = ScaledArray<promote_t<promote_t<A, B>, T>, common_policy_t<common_policy_t<PA, PB>, PT>>;

/// Whether linear's bias can enter the GEMM of a (..., K) by w (K, N) (see the file comment): the
/// types (a result in the product's compute type, static scales) are checked by linear_in_gemm.
template <class A, class PA, class B, class PB, class T, class PT>
[[nodiscard]] bool bias_enters_gemm(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& w, const ScaledArray<T, PT>& bias,
                                    tensor_core::grid_gemm_fn gemm)
{
    if (gemm != nullptr || a.dimension() < 2 || w.dimension() != 2 || a.shape()[a.dimension() - 1] != w.shape()[0]) return false;
    const std::size_t n = w.shape()[1];
    std::vector<std::size_t> out(a.shape().begin(), a.shape().end());
    out.back() = n;
    return element_count(out) > 1 && n > 0 && repeated_block_size(bias.data(), out) == n;
}

/// linear with the bias rows as the GEMM's initial result, or nullopt where it is matmul then add
/// (see the file comment). product_rule and sum_rule are the strategy's matmul and add rules.
template <bool NeedsAmax, class A, class PA, class B, class PB, class T, class PT>
[[nodiscard]] std::optional<linear_result_t<A, PA, B, PB, T, PT>> linear_in_gemm(const ScaledArray<A, PA>& a,
                                                                                 const ScaledArray<B, PB>& w,
                                                                                 const ScaledArray<T, PT>& bias,
                                                                                 scale_rule product_rule, scale_rule sum_rule,
                                                                                 tensor_core::grid_gemm_fn gemm)
{
    using C = std::common_type_t<compute_t<A>, compute_t<B>>;
    using R = promote_t<promote_t<A, B>, T>;
    using P = common_policy_t<common_policy_t<PA, PB>, PT>;
    if constexpr (NeedsAmax || !std::same_as<R, C> || !std::same_as<promote_t<A, B>, C>) {
        return std::nullopt;
    } else {
        if (!bias_enters_gemm(a, w, bias, gemm)) return std::nullopt;
        const auto [m, k, n] = matmul_extents(a.shape(), false, w.shape(), false);
        const scale_request product = matmul_request(a, w, k);
        const float product_scale = static_matmul_scale<P>(product, product_rule);
        scale_request sum;  // what add(matmul(a, w), bias) asks its rule
        sum.natural = std::max(product_scale, bias.scale());
        sum.input_scales[0] = product_scale;
        sum.input_scales[1] = bias.scale();
        sum.input_count = 2;
        sum.single_values[0] = std::numeric_limits<float>::quiet_NaN();  // the product has more than one element
        sum.single_values[1] = single_magnitude(bias);
        // A zero scale or an empty contraction: the composition's zero results, as it writes them.
        if (k == 0 || product.natural == 0.0f || product_scale == 0.0f || sum.natural == 0.0f) return std::nullopt;
        const float scale = checked_output_scale<P>(sum_rule(sum), "linear", sum);
        if (scale == 0.0f) return std::nullopt;

        std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
        shape.back() = n;
        xt::xarray<R> data = xt::xarray<R>::from_shape(shape);
        C* out = data.data();
        const T* b = bias.data().data();
        const auto bias_factor = static_cast<C>(double(bias.scale()) / double(scale));
        for (std::size_t j = 0; j < n; ++j) out[j] = load(b[j]) * bias_factor;
        for (std::size_t row = 1; row < m; ++row) {  // a loop, not a memcpy per row: 1.3-1.6x faster for rows of 384-512
            C* to = out + row * n;
            for (std::size_t j = 0; j < n; ++j) to[j] = out[j];
        }
        const auto alpha = static_cast<C>(double(product.natural) / double(scale));
        gemm_any_thread_count<C, false, false>(decoded<C>(a.data(), operand_panel<C, 0>()),
                                               decoded<C>(w.data(), operand_panel<C, 1>()), m, k, n, out, alpha,
                                               /*accumulate*/ true);
        ScaledArray<R, P> result(std::move(data), scale);
        check_output("linear", result);
        return result;
    }
}

}  // namespace detail

/// x.w + b with the bias added inside the GEMM (see the file comment); x (..., K), w (K, N), b
/// broadcast over the result (a row of N enters the GEMM). shape_error as matmul and add give.
template <class Strategy = default_scaling, class A, class PA, class B, class PB, class T, class PT>
[[nodiscard]] detail::linear_result_t<A, PA, B, PB, T, PT> linear(const ScaledArray<A, PA>& x, const ScaledArray<B, PB>& w,
                                                                  const ScaledArray<T, PT>& b)
{
    using P = common_policy_t<common_policy_t<PA, PB>, PT>;
    if (auto fused = detail::linear_in_gemm<detail::needs_amax_v<Strategy>>(
            x, w, b, detail::matmul_rule<Strategy, common_policy_t<PA, PB>>(), detail::rule_for<ops::add, Strategy, P>(),
            detail::current_gemm<A, B>())) {
        return std::move(*fused);
    }
    return add<Strategy>(matmul<Strategy>(x, w), b);
}

}  // namespace scalify
