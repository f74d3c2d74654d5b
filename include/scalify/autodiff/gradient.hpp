#pragma once
/// \file gradient.hpp
/// ad::gradient<P>: a cotangent (gradient) whose element type is decided while the graph runs.
/// A value's gradient is the sum of what its consumers send back, and they may send different
/// types (a cast_grad<float8_e5m2> consumer sends E5M2, a float32 one float), so the type cannot
/// be a template parameter of the value. It is one of float, double, Eigen::half, Eigen::bfloat16,
/// float8_e4m3fn and float8_e5m2, each with its own propagated scale.
///
///     auto g = grads.w1;                       // ad::gradient<pow2_scale>
///     fmt::print("{} {}\n", g.type_name(), g.scale());
///     ScaledArray<float, pow2_scale> f = g.as<float>();   // exact widening, same scale
///     g.visit([](const auto& array) { /* array is ScaledArray<G, P> */ });

#include <scalify/error.hpp>
#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/dtype.hpp>
#include <scalify/numeric/minifloat.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <concepts>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace scalify::ad {

/// Element types a gradient can hold.
template <class G>
concept GradientElement = std::same_as<G, float> || std::same_as<G, double> || std::same_as<G, Eigen::half> ||
                          std::same_as<G, Eigen::bfloat16> || std::same_as<G, float8_e4m3fn> ||
                          std::same_as<G, float8_e5m2>;

template <GradientElement G>
inline constexpr std::string_view gradient_type_name = element_name<G>;

template <ScalePolicy P>
class gradient {
public:
    using variant_type = std::variant<std::monostate, ScaledArray<float, P>, ScaledArray<double, P>,
                                      ScaledArray<Eigen::half, P>, ScaledArray<Eigen::bfloat16, P>,
                                      ScaledArray<float8_e4m3fn, P>, ScaledArray<float8_e5m2, P>>;

    /// No gradient yet (nothing was sent back).
    gradient() = default;

    /// A cotangent of any ScaledElement type: the six gradient types are kept as they are; any
    /// other minifloat widens exactly to float (same scale).
    template <ScaledElement G>
    gradient(ScaledArray<G, P> array)  // NOLINT: implicit, a gradient is a ScaledArray of some type
    {
        if constexpr (GradientElement<G>) m_array = std::move(array);
        else m_array = cast<float>(array);
    }

    [[nodiscard]] bool empty() const noexcept { return std::holds_alternative<std::monostate>(m_array); }
    explicit operator bool() const noexcept { return !empty(); }

    template <GradientElement G>
    [[nodiscard]] bool holds() const noexcept
    {
        return std::holds_alternative<ScaledArray<G, P>>(m_array);
    }

    /// f(const ScaledArray<G, P>&) for the type held (f(ScaledArray<G, P>&&) on an rvalue
    /// gradient, which f may move from); autodiff_error when empty.
    template <class F>
    decltype(auto) visit(F&& f) const&
    {
        return visit_held(*this, std::forward<F>(f));
    }
    template <class F>
    decltype(auto) visit(F&& f) &&
    {
        return visit_held(std::move(*this), std::forward<F>(f));
    }

    /// f(const ScaledArray<W, P>&) with W = double for a float64 gradient and W = float for every
    /// other (the narrower ones widened exactly, same scale; a float32 one not copied): for a
    /// consumer that computes in float or double (an optimiser), two instantiations of f instead
    /// of one per gradient type, with the values every type's own would read. autodiff_error when
    /// empty.
    template <class F>
    decltype(auto) visit_widened(F&& f) const
    {
        if (const auto* wide = std::get_if<ScaledArray<double, P>>(&m_array)) return std::forward<F>(f)(*wide);
        if (const auto* single = std::get_if<ScaledArray<float, P>>(&m_array)) return std::forward<F>(f)(*single);
        return std::forward<F>(f)(as<float>());  // the narrow types' values are floats: cast widens exactly
    }

    /// The gradient as element type U: a copy when it holds U, else a cast (nearest even).
    template <ScaledElement U>
    [[nodiscard]] ScaledArray<U, P> as() const
    {
        return visit([](const auto& array) { return cast<U>(array); });
    }
    [[nodiscard]] float scale() const
    {
        return visit([](const auto& array) { return array.scale(); });
    }
    [[nodiscard]] std::vector<std::size_t> shape() const
    {
        return visit([](const auto& array) { return std::vector<std::size_t>(array.shape().begin(), array.shape().end()); });
    }
    /// data * scale in float32 (float64 data are rounded).
    [[nodiscard]] xt::xarray<float> value() const
    {
        return visit([](const auto& array) { return xt::xarray<float>(array.value()); });
    }
    [[nodiscard]] std::string_view type_name() const
    {
        if (empty()) return "empty";
        return visit([](const auto& array) {
            return gradient_type_name<typename std::remove_cvref_t<decltype(array)>::value_type>;
        });
    }
    [[nodiscard]] const variant_type& variant() const noexcept { return m_array; }
    [[nodiscard]] variant_type&& variant_rvalue() && noexcept { return std::move(m_array); }

private:
    /// f(the held array), forwarded as self is (const lvalue or rvalue). A switch on the index
    /// rather than std::visit: every op's backward rule visits a gradient, and std::visit's
    /// checks of the visitor's result types (invoke_result and is_nothrow_invocable for every
    /// alternative, then its dispatch table) were a fifth of the autodiff tests' front end.
    template <class Self, class F>
    static decltype(auto) visit_held(Self&& self, F&& f)
    {
        static_assert(std::variant_size_v<variant_type> == 7, "visit_held: one case per alternative");
        auto&& held = std::forward<Self>(self).m_array;
        using held_type = decltype(held);
        switch (held.index()) {
        case 2: return std::forward<F>(f)(std::get<2>(std::forward<held_type>(held)));
        case 3: return std::forward<F>(f)(std::get<3>(std::forward<held_type>(held)));
        case 4: return std::forward<F>(f)(std::get<4>(std::forward<held_type>(held)));
        case 5: return std::forward<F>(f)(std::get<5>(std::forward<held_type>(held)));
        case 6: return std::forward<F>(f)(std::get<6>(std::forward<held_type>(held)));
        case 0: SCALIFY_THROW(autodiff_error("gradient::visit: the gradient is empty (nothing was sent back)")); break;
        default: break;
        }
        // Index 1 (float32); also where a user's SCALIFY_THROW returns, and std::get then throws
        // std::bad_variant_access.
        return std::forward<F>(f)(std::get<1>(std::forward<held_type>(held)));
    }

    variant_type m_array;
};

}  // namespace scalify::ad
