#pragma once
/// \file amax_scaling.hpp
/// fp8 recipes that scale a tensor from its amax before casting it:
/// - current_scaling<Format> (torchao "tensorwise"): the amax of the tensor being cast;
/// - delayed_scaling<Format> (TransformerEngine): the amax history of earlier casts, so the scale
///   is known before the data are (one step of lag).
/// The amax is the global one over the ranks of dist::current_reducer() (TransformerEngine's amax
/// reduction group), so every rank casts with the same scale; it is the amax of the finite
/// elements (strategy/non_finite.hpp). Both use the recipes' convention, a *multiplier*
/// q = max(Format) * 2^-margin / amax applied to the data before the cast; the ScaledArray they
/// return carries our convention, scale = 1 / q, so value() is the original tensor up to the
/// cast's rounding.
///
///     delayed_scaling<float8_e4m3fn> recipe;                 // history 1024, max, margin 0
///     auto x8 = recipe.quantize(activations);                  // uses the scale from history, then records amax

#include <scalify/dist/reducer.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/quantize.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace scalify {


/// The hybrid fp8 recipe's formats: E4M3 (precision) forward, E5M2 (range) for gradients.
struct hybrid_recipe {
    using forward = float8_e4m3fn;
    using backward = float8_e5m2;
};

/// torchao tensorwise scaling: q = max(Format) / amax, optionally rounded down to a power of two
/// (then the returned array is pow2_scale-valid). quantize() is quantize<Format, Policy>(x)
/// (quantize.hpp) with this object's power-of-two choice: the amax is that of the finite
/// elements, and an array with no finite non-zero element keeps scale 1.
template <ScaledElement Format>
struct current_scaling {
    bool power_of_two = false;

    [[nodiscard]] float multiplier(float amax) const noexcept
    {
        return power_of_two ? detail::amax_multiplier<Format, true>(amax) : detail::amax_multiplier<Format, false>(amax);
    }

    /// Under pow2_scale the multiplier rounds down to a power of two whatever power_of_two says.
    template <ScalePolicy Policy = float_scale, class T>
    [[nodiscard]] ScaledArray<Format, Policy> quantize(const xt::xarray<T>& x) const
    {
        const float amax_q = multiplier(detail::finite_amax("current_scaling::quantize", x.data(), x.size()));
        const float q = Policy::power_of_two ? pow2_round_down(amax_q) : amax_q;
        return ScaledArray<Format, Policy>(detail::cast_multiplied<Format, round_nearest_even, saturate_finite>(x, q, 0),
                                           1.0f / q);
    }
};

enum class amax_compute_algo { max, most_recent };

struct delayed_scaling_config {
    std::size_t amax_history_len = 1024;
    amax_compute_algo algo = amax_compute_algo::max;
    int margin = 0;  ///< binades of headroom, >= 0
};

/// TransformerEngine delayed scaling. quantize() casts with the current multiplier, records the
/// tensor's finite amax, and recomputes the multiplier from the history: q = max(Format) * 2^-margin /
/// amax(history), keeping the old q when that amax is 0, inf or NaN. Initial q = 1.
template <ScaledElement Format>
class delayed_scaling {
public:
    explicit delayed_scaling(delayed_scaling_config config = {}) : m_config(config)
    {
        if (config.amax_history_len == 0) {
            SCALIFY_THROW(config_error("delayed_scaling: amax_history_len must be > 0, got 0"));
        }
        if (config.margin < 0) {
            SCALIFY_THROW(config_error(fmt::format("delayed_scaling: margin must be >= 0, got {}", config.margin)));
        }
    }

    [[nodiscard]] float multiplier() const noexcept { return m_multiplier; }
    [[nodiscard]] const std::vector<float>& history() const noexcept { return m_history; }  ///< oldest first

    /// Record one amax and update the multiplier.
    void record(float amax)
    {
        if (m_history.size() == m_config.amax_history_len) m_history.erase(m_history.begin());
        m_history.push_back(amax);
        const float reference = m_config.algo == amax_compute_algo::most_recent
                                    ? m_history.back()
                                    : *std::max_element(m_history.begin(), m_history.end(), [](float a, float b) {
                                          return std::isnan(a) || (!std::isnan(b) && a < b);
                                      });
        if (reference > 0.0f && std::isfinite(reference)) {
            const double q = static_cast<double>(std::numeric_limits<Format>::max()) *
                             std::ldexp(1.0, -m_config.margin) / reference;
            const auto q_float = static_cast<float>(q);  // may underflow to 0 or overflow to inf: keep the old one then
            if (q_float > 0.0f && std::isfinite(q_float)) m_multiplier = q_float;
        }
    }

    /// Cast x with the multiplier known now, then record x's amax for the next cast.
    template <ScalePolicy Policy = float_scale, class T>
    [[nodiscard]] ScaledArray<Format, Policy> quantize(const xt::xarray<T>& x)
    {
        const float q = Policy::power_of_two ? pow2_round_down(m_multiplier) : m_multiplier;
        ScaledArray<Format, Policy> result(detail::cast_multiplied<Format, round_nearest_even, saturate_finite>(x, q, 0), 1.0f / q);
        record(detail::finite_amax("delayed_scaling::quantize", x.data(), x.size()));
        return result;
    }

private:
    delayed_scaling_config m_config;
    std::vector<float> m_history;
    float m_multiplier = 1.0f;
};

}  // namespace scalify
