#pragma once
/// \file numeric/dtype.hpp
/// dtype: the element types chosen at run time (mixed-precision scopes, the matmul recipe,
/// AutoScale, any_scaled_array): float32, float16, bfloat16, float8_e4m3fn, float8_e5m2; dtype_of<T>,
/// to_string, and visit_dtype, which calls a generic callable with the type a dtype names;
/// element_name<T>, the ml_dtypes name of any element type.

#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/minifloat.hpp>

#include <array>
#include <concepts>
#include <string_view>
#include <utility>

namespace scalify {

namespace detail {

/// "float{bits}_e{E}m{M}{suffix}" as ml_dtypes spells it: "fn" for formats without inf ("fnu"
/// unsigned), "fnuz" for those whose one NaN is -0, "b{bias}" where the bias is not the format
/// family's (2^(E-1) - 1, or 2^(E-1) for fnuz). Built once per format at compile time.
template <FloatFormat F>
struct minifloat_name {
    static constexpr auto text = [] {
        std::array<char, 32> out{};
        std::size_t n = 0;
        const auto put = [&](std::string_view s) {
            for (const char c : s) out[n++] = c;
        };
        const auto put_number = [&](int v) {
            if (v >= 10) out[n++] = static_cast<char>('0' + v / 10);
            out[n++] = static_cast<char>('0' + v % 10);
        };
        put("float");
        put_number(F::total_bits);
        put("_e");
        put_number(F::exponent_bits);
        put("m");
        put_number(F::mantissa_bits);
        const bool fnuz = F::specials == special_values::nan_negative_zero;
        const int family_bias = (1 << (F::exponent_bits - 1)) - (fnuz ? 0 : 1);
        if (F::bias != family_bias) {
            put("b");
            put_number(F::bias);
        }
        if (fnuz) put("fnuz");
        else if (F::specials != special_values::ieee) put(F::is_signed ? "fn" : "fnu");
        return std::pair{out, n};
    }();
    static constexpr std::string_view value{text.first.data(), text.second};
};

}  // namespace detail

/// The ml_dtypes / PyTorch name of an element type: "float32", "float64", "float16", "bfloat16",
/// "float8_e4m3fn", "float4_e2m1fn", "float8_e8m0fnu", "float8_e4m3b11fnuz", ...
template <class T>
    requires(std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, Eigen::half> ||
             std::same_as<T, Eigen::bfloat16> || Minifloat<T>)
inline constexpr std::string_view element_name = [] {
    if constexpr (std::same_as<T, float>) return std::string_view("float32");
    else if constexpr (std::same_as<T, double>) return std::string_view("float64");
    else if constexpr (std::same_as<T, Eigen::half>) return std::string_view("float16");
    else if constexpr (std::same_as<T, Eigen::bfloat16>) return std::string_view("bfloat16");
    else return detail::minifloat_name<typename T::format>::value;
}();

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
