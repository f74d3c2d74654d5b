#pragma once
/// \file policy.hpp
/// Mixed-precision policy (TVM's mixed-precision pass, PyTorch autocast): every op has a class,
/// - allow:  always run in the low-precision type (matmul);
/// - follow: run in low precision if every input already is (add, mul, relu, reshape, ...);
/// - deny:   compute in float32 (exp, log, softmax, reductions);
/// plus an accumulation and an output type. op_precision<Op, Policy> gives them; a user overrides
/// one op by specialising it, or writes a whole policy type with its own `rule<Op>`.
/// amp<Policy>::op(...) applies the class to any_scaled_array operands when autocast is on in
/// this thread, and runs everything in float32 when it is off. docs/amp.md has the table.
///
///     const autocast on;
///     any_scaled_array<> y = amp<half_policy>::matmul(x, w);   // float16
///     auto p = amp<half_policy>::softmax(y, 1);                 // float32

#include <scalify/amp/any_scaled_array.hpp>
#include <scalify/amp/autocast.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/matmul.hpp>
#include <scalify/ops/nn.hpp>
#include <scalify/ops/reduce.hpp>
#include <scalify/ops/shape.hpp>
#include <scalify/strategy/scaling.hpp>

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace scalify {

enum class precision_class { allow, follow, deny };

/// The default class of each op (TVM / TensorFlow lists).
template <class Op>
inline constexpr precision_class default_precision_class =
    std::same_as<Op, ops::matmul> ? precision_class::allow
    : (std::same_as<Op, ops::exp> || std::same_as<Op, ops::log> || std::same_as<Op, ops::softmax> ||
       std::same_as<Op, ops::reduce_sum> || std::same_as<Op, ops::reduce_max> || std::same_as<Op, ops::sqrt>)
        ? precision_class::deny
        : precision_class::follow;

/// One op's rule: class, accumulation type (what the kernel sums in), output type (of a
/// low-precision run; deny ops output float).
template <precision_class Class, class Low>
struct precision_rule {
    static constexpr precision_class value = Class;
    using accumulate = float;
    using output = std::conditional_t<Class == precision_class::deny, float, Low>;
};

/// A whole policy: the low-precision type and, per op, the default rule.
template <RuntimeDtype Low>
struct amp_policy {
    using low_precision = Low;
    template <class Op>
    using rule = precision_rule<default_precision_class<Op>, Low>;
};
using half_policy = amp_policy<Eigen::half>;
using bfloat16_policy = amp_policy<Eigen::bfloat16>;
using fp8_policy = amp_policy<float8_e4m3fn>;

/// The trait the amp ops read; specialise it to override one op under one policy.
template <class Op, class Policy>
struct op_precision : Policy::template rule<Op> {};

template <class P>
concept AmpPolicy = RuntimeDtype<typename P::low_precision> && requires {
    { op_precision<ops::matmul, P>::value } -> std::convertible_to<precision_class>;
    typename op_precision<ops::matmul, P>::accumulate;
    typename op_precision<ops::matmul, P>::output;
};

template <AmpPolicy Policy>
class amp {
    using low = typename Policy::low_precision;

    /// Runs op Op: in (rule::output, inputs cast to low) when the class says low precision, else in
    /// float32. run is a generic lambda templated on the output type.
    template <class Op, ScalePolicy P, class Run, class... Inputs>
    [[nodiscard]] static any_scaled_array<P> apply(Run run, const Inputs&... inputs)
    {
        using rule = op_precision<Op, Policy>;
        static_assert(std::same_as<typename rule::accumulate, float>,
                      "scalify's kernels accumulate in float32: op_precision<...>::accumulate must be float");
        constexpr precision_class cls = rule::value;
        bool low_precision = false;
        if (autocast_enabled()) {
            if constexpr (cls == precision_class::allow) low_precision = true;
            else if constexpr (cls == precision_class::follow) low_precision = (inputs.template holds<low>() && ...);
        }
        (void)low_precision;  // unread for deny ops
        if constexpr (cls != precision_class::deny) {
            if (low_precision) return run.template operator()<typename rule::output>(inputs.template as<low>()...);
        }
        return run.template operator()<float>(inputs.template as<float>()...);
    }

public:
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> matmul(const any_scaled_array<P>& a, const any_scaled_array<P>& b)
    {
        return apply<ops::matmul, P>([]<class Out>(const auto& x, const auto& y) { return scalify::matmul<default_scaling, Out>(x, y); }, a, b);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> add(const any_scaled_array<P>& a, const any_scaled_array<P>& b)
    {
        return apply<ops::add, P>([]<class Out>(const auto& x, const auto& y) { return scalify::add<default_scaling, Out>(x, y); }, a, b);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> mul(const any_scaled_array<P>& a, const any_scaled_array<P>& b)
    {
        return apply<ops::mul, P>([]<class Out>(const auto& x, const auto& y) { return scalify::mul<default_scaling, Out>(x, y); }, a, b);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> sub(const any_scaled_array<P>& a, const any_scaled_array<P>& b)
    {
        return apply<ops::sub, P>([]<class Out>(const auto& x, const auto& y) { return scalify::sub<default_scaling, Out>(x, y); }, a, b);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> div(const any_scaled_array<P>& a, const any_scaled_array<P>& b)
    {
        return apply<ops::div, P>([]<class Out>(const auto& x, const auto& y) { return scalify::div<default_scaling, Out>(x, y); }, a, b);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> maximum(const any_scaled_array<P>& a, const any_scaled_array<P>& b)
    {
        return apply<ops::maximum, P>([]<class Out>(const auto& x, const auto& y) { return scalify::maximum<default_scaling, Out>(x, y); }, a, b);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> minimum(const any_scaled_array<P>& a, const any_scaled_array<P>& b)
    {
        return apply<ops::minimum, P>([]<class Out>(const auto& x, const auto& y) { return scalify::minimum<default_scaling, Out>(x, y); }, a, b);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> neg(const any_scaled_array<P>& a)
    {
        return apply<ops::neg, P>([]<class Out>(const auto& x) { return cast<Out>(scalify::neg(x)); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> abs(const any_scaled_array<P>& a)
    {
        return apply<ops::abs, P>([]<class Out>(const auto& x) { return cast<Out>(scalify::abs(x)); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> sqrt(const any_scaled_array<P>& a)
    {
        return apply<ops::sqrt, P>([]<class Out>(const auto& x) { return cast<Out>(scalify::sqrt(x)); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> reduce_max(const any_scaled_array<P>& a, std::vector<std::size_t> axes)
    {
        return apply<ops::reduce_max, P>(
            [&axes]<class Out>(const auto& x) { return scalify::reduce_max<default_scaling, Out>(x, axes); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> transpose(const any_scaled_array<P>& a)
    {
        return apply<ops::layout, P>([]<class Out>(const auto& x) { return cast<Out>(scalify::transpose(x)); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> relu(const any_scaled_array<P>& a)
    {
        return apply<ops::relu, P>([]<class Out>(const auto& x) { return cast<Out>(scalify::relu(x)); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> gelu(const any_scaled_array<P>& a)
    {
        return apply<ops::gelu, P>([]<class Out>(const auto& x) { return cast<Out>(scalify::gelu(x)); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> exp(const any_scaled_array<P>& a)
    {
        return apply<ops::exp, P>([]<class Out>(const auto& x) { return cast<Out>(scalify::exp(x)); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> log(const any_scaled_array<P>& a)
    {
        return apply<ops::log, P>([]<class Out>(const auto& x) { return cast<Out>(scalify::log(x)); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> softmax(const any_scaled_array<P>& a, std::size_t axis)
    {
        return apply<ops::softmax, P>([axis]<class Out>(const auto& x) { return scalify::softmax<default_scaling, Out>(x, axis); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> reduce_sum(const any_scaled_array<P>& a, std::vector<std::size_t> axes)
    {
        return apply<ops::reduce_sum, P>(
            [&axes]<class Out>(const auto& x) { return scalify::reduce_sum<default_scaling, Out>(x, axes); }, a);
    }
    template <ScalePolicy P>
    [[nodiscard]] static any_scaled_array<P> reshape(const any_scaled_array<P>& a, std::vector<std::size_t> shape)
    {
        return apply<ops::layout, P>([&shape]<class Out>(const auto& x) { return cast<Out>(scalify::reshape(x, shape)); }, a);
    }
};

}  // namespace scalify
