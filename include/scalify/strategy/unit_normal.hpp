#pragma once
/// \file unit_normal.hpp
/// Moments of op outputs for unit-normal data: the ground of unit_scaling's rules
/// (strategy/scaling.hpp; derivations in docs/ops.md). Internal.
///
/// Expectations over z ~ N(0, 1) use the trapezoid rule on [-9, 9]: for smooth integrands under a
/// Gaussian weight it converges geometrically, and the tails beyond 9 weigh < 1e-18. Softmax's
/// E[sum_i p_i^2] is computed exactly (up to quadrature) through 1/T^2 = int_0^inf t e^(-tT) dt,
/// which turns the expectation over L dependent probabilities into one over a single logit.
/// Results of the costlier rules are memoised per thread (a model asks the same shapes and scales
/// at every step), so a rule costs a few table look-ups after its first use.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>

namespace scalify::detail::unit_normal {

inline constexpr double inv_sqrt2 = 0.70710678118654752440;
inline constexpr double inv_sqrt_2pi = 0.39894228040143267794;

/// E[f(z)], z ~ N(0, 1). `sharpness` is how fast f varies in z (f(sharpness * z) has features of
/// width ~1/sharpness): the step follows it, up to 4096 intervals.
template <class F>
[[nodiscard]] double expect(F f, double sharpness) noexcept
{
    constexpr double half_width = 9.0;
    const double step = std::max(1.0 / (8.0 * std::max(sharpness, 1.0)), 2.0 * half_width / 4096.0);
    const auto intervals = static_cast<int>(std::ceil(2.0 * half_width / step));
    const double h = 2.0 * half_width / intervals;
    double total = 0.0, weight_total = 0.0;
    for (int i = 0; i <= intervals; ++i) {
        const double z = -half_width + i * h;
        const double w = std::exp(-0.5 * z * z) * ((i == 0 || i == intervals) ? 0.5 : 1.0);
        total += w * f(z);
        weight_total += w;
    }
    return total / weight_total;  // normalising by the discrete weights cancels the grid's own error in E[1]
}

/// Per-thread memo of the last few results of one rule, keyed by its two arguments.
enum class rule_id : int { gelu, gelu_grad, tanh, tanh_grad, softmax };

template <class F>
[[nodiscard]] double memoised(rule_id rule, double a, double b, F compute) noexcept
{
    struct entry {
        rule_id rule;
        double a, b, value;
        bool used;
    };
    thread_local std::array<entry, 32> entries{};
    thread_local std::size_t next = 0;
    for (const entry& e : entries) {
        if (e.used && e.rule == rule && e.a == a && e.b == b) return e.value;
    }
    const double value = compute();
    entries[next] = {rule, a, b, value, true};
    next = (next + 1) % entries.size();
    return value;
}

/// RMS of relu(sigma z): E[relu(x)^2] = sigma^2 / 2 (half the mass, even function).
[[nodiscard]] inline double relu_rms(double sigma) noexcept { return sigma * inv_sqrt2; }

/// RMS of the standard normal CDF Phi(sigma z) and pdf: helpers of gelu.
[[nodiscard]] inline double normal_cdf(double x) noexcept { return 0.5 * std::erfc(-x * inv_sqrt2); }
[[nodiscard]] inline double normal_pdf(double x) noexcept { return inv_sqrt_2pi * std::exp(-0.5 * x * x); }

/// RMS of gelu(sigma z) = sigma z Phi(sigma z): sigma * sqrt(E[z^2 Phi(sigma z)^2]).
/// sigma -> 0: sigma / 2; sigma = 1: 0.5880 (unit-scaling's 1/0.588); sigma -> inf: sigma / sqrt(2).
[[nodiscard]] inline double gelu_rms(double sigma) noexcept
{
    return sigma * std::sqrt(memoised(rule_id::gelu, sigma, 0.0, [sigma] {
               return expect([sigma](double z) { const double c = z * normal_cdf(sigma * z); return c * c; }, sigma);
           }));
}

/// RMS of gelu'(sigma z) = Phi(x) + x phi(x) at x = sigma z. sigma -> 0: 1/2; sigma = 1: 0.6749
/// (unit-scaling's 1/0.675); sigma -> inf: 1/sqrt(2).
[[nodiscard]] inline double gelu_grad_rms(double sigma) noexcept
{
    return std::sqrt(memoised(rule_id::gelu_grad, sigma, 0.0, [sigma] {
        return expect([sigma](double z) {
            const double x = sigma * z, d = normal_cdf(x) + x * normal_pdf(x);
            return d * d;
        }, sigma);
    }));
}

/// RMS of tanh(sigma z). sigma -> 0: sigma; sigma = 1: 0.6278; sigma -> inf: 1.
[[nodiscard]] inline double tanh_rms(double sigma) noexcept
{
    return std::sqrt(memoised(rule_id::tanh, sigma, 0.0, [sigma] {
        return expect([sigma](double z) { const double t = std::tanh(sigma * z); return t * t; }, sigma);
    }));
}

/// RMS of tanh'(sigma z) = 1 - tanh^2. sigma -> 0: 1; sigma = 1: 0.6815; sigma -> inf: 0 (the grid's
/// finest step floors it at 0.04 beyond sigma ~ 300, where the gradient is all but zero anyway).
[[nodiscard]] inline double tanh_grad_rms(double sigma) noexcept
{
    return std::sqrt(memoised(rule_id::tanh_grad, sigma, 0.0, [sigma] {
        return expect([sigma](double z) { const double t = std::tanh(sigma * z); return (1 - t * t) * (1 - t * t); }, sigma);
    }));
}

/// RMS of e^(sigma z): E[e^(2 sigma z)] = e^(2 sigma^2), so e^(sigma^2). The log is capped at 80
/// (e^80 ~ 5.5e34 < float max): beyond, the expectation is carried by samples no finite tensor holds.
[[nodiscard]] inline double exp_rms(double sigma) noexcept { return std::exp(std::min(sigma * sigma, 80.0)); }

/// E[sum_i p_i^2] for p = softmax(sigma z) over `length` i.i.d. unit normals z_i: between 1/L
/// (flat) and 1 (one-hot). With X_i = e^(sigma z_i) and T = sum X_i,
///     E[p_1^2] = E[X_1^2 / T^2] = int_0^inf t E[X^2 e^(-tX)] E[e^(-tX)]^(L-1) dt,
/// one integral over t (as u = log t) of one-dimensional expectations. sigma above 8 is taken as
/// 8 (the softmax is then one-hot for any length a tensor can have).
[[nodiscard]] inline double softmax_sum_squares(double length, double sigma) noexcept
{
    if (!(length > 1.0)) return 1.0;
    if (!(sigma > 0.0)) return 1.0 / length;
    sigma = std::min(sigma, 8.0);
    const double q = memoised(rule_id::softmax, length, sigma, [length, sigma] {
        constexpr double half_width = 9.0;
        const double hz = std::min(0.25, 0.25 / sigma);
        const auto nz = static_cast<int>(std::ceil(2.0 * half_width / hz));
        // t from where t^2 E[X^2] is negligible (e^-28 below the peak near t = 1/(L E[X])) to
        // where t X > 50 at every node (then (tX)^2 e^-tX < 1e-18).
        const double u_low = -std::log(length) - sigma * sigma - 14.0;
        const double u_high = half_width * sigma + 4.0;
        constexpr double du = 0.25;
        double integral = 0.0;
        for (double u = u_low; u <= u_high; u += du) {
            const double t = std::exp(u);
            double a = 0.0, one_minus_b = 0.0, weights = 0.0;
            for (int i = 0; i <= nz; ++i) {
                const double z = -half_width + i * (2.0 * half_width / nz);
                const double w = std::exp(-0.5 * z * z);
                const double x = std::exp(sigma * z);
                a += w * std::exp(2.0 * sigma * z - t * x);
                one_minus_b += w * -std::expm1(-t * x);
                weights += w;
            }
            a /= weights;
            one_minus_b /= weights;
            const double rest = std::exp((length - 1.0) * std::log1p(-std::min(one_minus_b, 1.0)));
            integral += t * t * a * rest * du;
        }
        return length * integral;
    });
    return std::clamp(q, 1.0 / length, 1.0);
}

/// RMS of log_softmax(sigma z) over `length`, z_i unit normals: E[(sigma z_1 - log T)^2]
///     = sigma^2 - 2 sigma E[z_1 log T] + E[(log T)^2],
/// with E[z_1 log T] = sigma E[p_1] = sigma / L exactly (Stein's lemma) and log T normal with T's
/// mean L e^(sigma^2/2) and variance L (e^(2 sigma^2) - e^(sigma^2)) (Fenton-Wilkinson):
/// v = log(1 + (e^(sigma^2) - 1) / L), mu = log L + sigma^2 / 2 - v / 2. Within 1 % of Monte Carlo
/// for sigma <= 1 and any L >= 2; 18 % low at sigma = 4, L = 8.
[[nodiscard]] inline double log_softmax_rms(double length, double sigma) noexcept
{
    if (!(length > 1.0)) return 0.0;  // one class: log_softmax is 0
    const double s2 = sigma * sigma;
    const double v = s2 < 50.0 ? std::log1p(std::expm1(s2) / length)
                               : s2 - std::log(length) + std::log1p((length - 1.0) * std::exp(-s2));
    const double mu = std::log(length) + 0.5 * s2 - 0.5 * v;
    return std::sqrt(s2 * (1.0 - 2.0 / length) + mu * mu + v);
}

}  // namespace scalify::detail::unit_normal
