#pragma once
/// \file any_scaled_array.hpp
/// any_scaled_array<Policy>: a ScaledArray whose element type is chosen at run time among the
/// types mixed precision uses (float, Eigen::half, Eigen::bfloat16, float8_e4m3fn, float8_e5m2).
/// The runtime autocast layer (<scalify/amp/policy.hpp>) works on it, since a scope that turns
/// low precision on or off at run time cannot change a C++ type.

#include <scalify/numeric/dtype.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>

#include <string_view>
#include <utility>
#include <variant>

namespace scalify {

template <ScalePolicy Policy = float_scale>
class any_scaled_array {
public:
    using variant_type = std::variant<ScaledArray<float, Policy>, ScaledArray<Eigen::half, Policy>,
                                      ScaledArray<Eigen::bfloat16, Policy>, ScaledArray<float8_e4m3fn, Policy>,
                                      ScaledArray<float8_e5m2, Policy>>;

    template <RuntimeDtype T>
    any_scaled_array(ScaledArray<T, Policy> array) : m_array(std::move(array))  // NOLINT: implicit by design
    {
    }

    [[nodiscard]] dtype type() const noexcept
    {
        return std::visit([](const auto& a) { return dtype_of<typename std::decay_t<decltype(a)>::value_type>; }, m_array);
    }
    template <RuntimeDtype T>
    [[nodiscard]] bool holds() const noexcept
    {
        return std::holds_alternative<ScaledArray<T, Policy>>(m_array);
    }
    /// The array as element type T: itself if it holds T, else a cast (nearest even, no saturation).
    template <RuntimeDtype T>
    [[nodiscard]] ScaledArray<T, Policy> as() const
    {
        return std::visit([](const auto& a) { return cast<T>(a); }, m_array);
    }
    [[nodiscard]] float scale() const noexcept
    {
        return std::visit([](const auto& a) { return a.scale(); }, m_array);
    }
    [[nodiscard]] xt::xarray<float> value() const
    {
        return std::visit([](const auto& a) { return xt::xarray<float>(a.value()); }, m_array);
    }
    [[nodiscard]] const variant_type& variant() const noexcept { return m_array; }

private:
    variant_type m_array;
};

}  // namespace scalify
