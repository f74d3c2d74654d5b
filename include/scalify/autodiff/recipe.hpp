#pragma once
/// \file recipe.hpp
/// The low-precision matmul recipe of a differentiable computation, chosen around the model
/// instead of inside it (TransformerEngine's fp8_autocast, in scalify's terms): within a
/// matmul_precision_scope every differentiable matmul casts both operands to the forward type
/// (nearest even, saturating to the largest finite value, at the operands' propagated scales:
/// no amax is measured) and the cotangent that reaches the product to the gradient type
/// (cast_grad). Scales keep propagating through every op, forward and backward; the product is
/// stored in the type it has without the scope, so the model's types do not change.
///
///     ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
///     auto [loss, grads] = ad::value_and_grad<unit_scaling>(model, params);
///
/// The setting is per thread, nests, and is restored by the scope's destructor (also when an
/// exception leaves the scope).

#include <scalify/amp/any_scaled_array.hpp>
#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/minifloat.hpp>

namespace scalify::ad {

/// The types of a differentiable matmul's operands (forward) and of the cotangent reaching it
/// (gradient); float32 means no cast.
struct matmul_precision {
    dtype forward = dtype::float32;
    dtype gradient = dtype::float32;
};

namespace detail {
inline matmul_precision& matmul_precision_state() noexcept
{
    thread_local matmul_precision state{};
    return state;
}

/// f.template operator()<T>() for the element type T that `type` names.
template <class F>
decltype(auto) with_dtype(dtype type, F&& f)
{
    switch (type) {
    case dtype::float16: return std::forward<F>(f).template operator()<Eigen::half>();
    case dtype::bfloat16: return std::forward<F>(f).template operator()<Eigen::bfloat16>();
    case dtype::float8_e4m3fn: return std::forward<F>(f).template operator()<float8_e4m3fn>();
    case dtype::float8_e5m2: return std::forward<F>(f).template operator()<float8_e5m2>();
    case dtype::float32: break;
    }
    return std::forward<F>(f).template operator()<float>();
}
}  // namespace detail

/// This thread's matmul recipe (float32 / float32 outside any scope).
[[nodiscard]] inline matmul_precision current_matmul_precision() noexcept { return detail::matmul_precision_state(); }

/// Sets this thread's matmul recipe for the scope's lifetime.
class matmul_precision_scope {
public:
    matmul_precision_scope(dtype forward, dtype gradient) noexcept : m_previous(detail::matmul_precision_state())
    {
        detail::matmul_precision_state() = {forward, gradient};
    }
    ~matmul_precision_scope() { detail::matmul_precision_state() = m_previous; }
    matmul_precision_scope(const matmul_precision_scope&) = delete;
    matmul_precision_scope& operator=(const matmul_precision_scope&) = delete;

private:
    matmul_precision m_previous;
};

}  // namespace scalify::ad
