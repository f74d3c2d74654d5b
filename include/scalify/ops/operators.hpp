#pragma once
/// \file operators.hpp
/// + - * / and unary - on ScaledArrays, found by ADL, so model code written with operators runs
/// on plain ScaledArrays (here, under default_scaling) and on ad::var (under the var's strategy).
/// A double folds into the scale (mul / div with a scalar). For another strategy, call the named
/// op: add<unit_scaling>(a, b).

#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>

namespace scalify {

template <class A, class PA, class B, class PB>
[[nodiscard]] auto operator+(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return add(a, b);
}
template <class A, class PA, class B, class PB>
[[nodiscard]] auto operator-(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return sub(a, b);
}
template <class A, class PA, class B, class PB>
[[nodiscard]] auto operator*(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return mul(a, b);
}
template <class A, class PA, class B, class PB>
[[nodiscard]] auto operator/(const ScaledArray<A, PA>& a, const ScaledArray<B, PB>& b)
{
    return div(a, b);
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> operator-(const ScaledArray<T, P>& a)
{
    return neg(a);
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> operator*(const ScaledArray<T, P>& a, double c)
{
    return mul(a, c);
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> operator*(double c, const ScaledArray<T, P>& a)
{
    return mul(a, c);
}
template <class T, class P>
[[nodiscard]] ScaledArray<T, P> operator/(const ScaledArray<T, P>& a, double c)
{
    return div(a, c);
}

}  // namespace scalify
