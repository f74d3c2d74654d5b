#pragma once
/// \file numeric/dtype.hpp
/// dtype: the element types chosen at run time (mixed-precision scopes, the matmul recipe,
/// AutoScale, any_scaled_array): float32, float16, bfloat16, float8_e4m3fn, float8_e5m2; dtype_of<T>,
/// to_string, and visit_dtype, which calls a generic callable with the type a dtype names.

#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/minifloat.hpp>

#include <concepts>
#include <string_view>
#include <utility>

namespace scalify {

enum class dtype { float32, float16, bfloat16, float8_e4m3fn, float8_e5m2 };

[[nodiscard]] constexpr std::string_view to_string(dtype t) noexcept
{
    switch (t) {
    case dtype::float32: return "float32";
    case dtype::float16: return "float16";
    case dtype::bfloat16: return "bfloat16";
    case dtype::float8_e4m3fn: return "float8_e4m3fn";
    case dtype::float8_e5m2: return "float8_e5m2";
    }
    return "?";
}

template <class T>
inline constexpr bool is_runtime_dtype_v = false;
template <> inline constexpr bool is_runtime_dtype_v<float> = true;
template <> inline constexpr bool is_runtime_dtype_v<Eigen::half> = true;
template <> inline constexpr bool is_runtime_dtype_v<Eigen::bfloat16> = true;
template <> inline constexpr bool is_runtime_dtype_v<float8_e4m3fn> = true;
template <> inline constexpr bool is_runtime_dtype_v<float8_e5m2> = true;

/// The element types a dtype names (those any_scaled_array holds).
template <class T>
concept RuntimeDtype = is_runtime_dtype_v<T>;

template <RuntimeDtype T>
inline constexpr dtype dtype_of = std::same_as<T, float>             ? dtype::float32
                                  : std::same_as<T, Eigen::half>     ? dtype::float16
                                  : std::same_as<T, Eigen::bfloat16> ? dtype::bfloat16
                                  : std::same_as<T, float8_e4m3fn>   ? dtype::float8_e4m3fn
                                                                     : dtype::float8_e5m2;

/// f.template operator()<T>() for the element type T that `type` names: the one place a dtype
/// chosen at run time becomes a C++ type (PyTorch's AT_DISPATCH), e.g.
///     visit_dtype(t, [&]<class T>() { return cast<T>(x).value(); });
template <class F>
decltype(auto) visit_dtype(dtype type, F&& f)
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

}  // namespace scalify
