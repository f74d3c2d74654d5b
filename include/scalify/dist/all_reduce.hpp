#pragma once
/// \file all_reduce.hpp
/// all_reduce_gradients: the data-parallel sum (or mean) of gradient trees across ranks, with
/// scales respected. Per tensor:
/// 1. the ranks agree on a common power-of-two scale s from the global amax of the values
///    (data x scale) and the wire type W: |value| / s <= max(W), and ranks x max(W) fits the
///    accumulator, so nothing overflows;
/// 2. each rank re-expresses its values in s, rounded once to W (nearest even; inf and NaN cross
///    as NaN), and the ranks all-gather the W data: one block per rank, W's bytes per element;
/// 3. every rank sums the blocks in rank order in float32 (float64 for float64 gradients), so the
///    result is the same bits on every rank and does not depend on the reducer's algorithm.
/// The result is a float32 (float64) gradient under scale s, or s / ranks for the mean (data
/// divided by the rank count instead when that is not a power of two).
///
/// The amax, a non-finite flag and each tensor's type and size cross in one small reduction
/// first; tensors whose type or size differ between ranks are a distributed_error on every rank.
///
///     auto [loss, grads] = ad::value_and_grad<unit_scaling>(objective, params);   // local batch
///     const auto report = dist::all_reduce_gradients(grads);                    // mean over ranks
///     dist::all_reduce_gradients(grads, {.wire = dtype::float8_e5m2});          // fp8 on the wire

#include <scalify/amp/any_scaled_array.hpp>
#include <scalify/autodiff/grad.hpp>
#include <scalify/autodiff/gradient.hpp>
#include <scalify/dist/reducer.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/minifloat.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace scalify::dist {

struct all_reduce_options {
    std::optional<dtype> wire;  ///< the type every gradient crosses as; none: each its own element type
    bool average = true;        ///< divide by the number of ranks (the data-parallel mean), else the sum
};

/// What one all_reduce_gradients call did, on this rank.
struct all_reduce_report {
    std::size_t tensors = 0;
    std::size_t elements = 0;
    std::size_t storage_bytes = 0;  ///< the gradients' bytes in their own element types
    std::size_t wire_bytes = 0;     ///< this rank's block of gradient data (W's bytes, tensors aligned to 8)
    std::size_t payload_bytes = 0;  ///< everything this rank handed to collectives: the block and the agreement
    bool found_non_finite = false;  ///< some rank's gradient held inf or NaN: the same answer on every rank
};

namespace detail {

// The gradient element types by a number that crosses ranks (the order of ad::gradient's variant).
using wire_types = std::tuple<float, double, Eigen::half, Eigen::bfloat16, float8_e4m3fn, float8_e5m2>;

template <class T, std::size_t I = 0>
[[nodiscard]] consteval int type_code()
{
    if constexpr (std::same_as<T, std::tuple_element_t<I, wire_types>>) return static_cast<int>(I);
    else return type_code<T, I + 1>();
}

[[nodiscard]] inline int type_code(dtype t) noexcept
{
    switch (t) {
    case dtype::float16: return type_code<Eigen::half>();
    case dtype::bfloat16: return type_code<Eigen::bfloat16>();
    case dtype::float8_e4m3fn: return type_code<float8_e4m3fn>();
    case dtype::float8_e5m2: return type_code<float8_e5m2>();
    case dtype::float32: break;
    }
    return type_code<float>();
}

/// f.template operator()<W>() for the gradient element type numbered `code`.
template <class F>
decltype(auto) with_type_code(int code, F&& f)
{
    switch (code) {
    case 1: return std::forward<F>(f).template operator()<double>();
    case 2: return std::forward<F>(f).template operator()<Eigen::half>();
    case 3: return std::forward<F>(f).template operator()<Eigen::bfloat16>();
    case 4: return std::forward<F>(f).template operator()<float8_e4m3fn>();
    case 5: return std::forward<F>(f).template operator()<float8_e5m2>();
    default: break;
    }
    return std::forward<F>(f).template operator()<float>();
}

template <class W>
using accumulator_t = std::conditional_t<std::same_as<W, double>, double, float>;

/// What one rank knows of a tensor before the agreement, in the layout the max-reduction takes:
/// amax of the finite values, the non-finite flag, and the type and size twice (negated), so
/// that one max says whether every rank has the same.
inline constexpr std::size_t agreement_fields = 6;

/// The smallest power of two s with amax / s <= limit, within float's normal range (1 for amax 0).
[[nodiscard]] inline double common_scale(double amax, double limit) noexcept
{
    if (!(amax > 0.0) || !std::isfinite(amax)) return 1.0;
    int exponent = 0;
    const double mantissa = std::frexp(amax / limit, &exponent);  // amax / limit = mantissa * 2^exponent, mantissa in [0.5, 1)
    if (mantissa == 0.5) --exponent;
    const int lowest = std::numeric_limits<float>::min_exponent - 1;  // 2^-126
    const int highest = std::numeric_limits<float>::max_exponent - 1;  // 2^127
    return std::ldexp(1.0, exponent < lowest ? lowest : exponent > highest ? highest : exponent);
}

/// x rounded to W: nearest even, saturating (the caller's scale keeps |x| <= max(W)).
template <class W, class X>
[[nodiscard]] W to_wire(X x) noexcept
{
    if constexpr (std::same_as<W, double> || std::same_as<W, float>) return static_cast<W>(x);
    else return convert<W, round_nearest_even, saturate_finite>(x);
}

/// values of `array` / s, each rounded once to W (nearest even, saturating; inf and NaN as NaN),
/// written to out. The gradient's element type reaches it only as its widening function (exact,
/// to double: the one an inspection reads arrays with), so this is compiled once per wire type, not
/// once per pair of gradient and wire types; chunks of 512 values stay in L1 between the steps.
template <class W>
void encode_block(const ad::detail::erased_array& array, double s, std::byte* out)
{
    const double k = static_cast<double>(array.scale) / s;
    const W nan = std::numeric_limits<W>::quiet_NaN();
    const auto kf = static_cast<float>(k);
    // A power-of-two k within float's normal range: multiplying in float rounds nothing (unless
    // the product is subnormal), and float is the fast path. Any other k: in double, one rounding.
    // (The float path reads a double gradient rounded to float.)
    const bool power_of_two = static_cast<double>(kf) == k && kf >= std::numeric_limits<float>::min() &&
                              kf <= std::numeric_limits<float>::max() && is_pow2_or_zero(kf);
    std::array<double, 512> values;
    std::array<W, 512> block;
    for (std::size_t first = 0; first < array.size; first += block.size()) {
        const std::size_t count = std::min(block.size(), array.size - first);
        if (array.scale == 0.0f) {
            std::fill_n(block.data(), count, W{});  // a zero-scale array is zeros, whatever its data hold
        } else {
            array.type->widen(array.data, first, count, values.data());
            if (!std::same_as<W, double> && power_of_two) {
                for (std::size_t i = 0; i < count; ++i) {
                    const auto v = static_cast<float>(values[i]);
                    block[i] = std::isfinite(v) ? to_wire<W>(v * kf) : nan;
                }
            } else {
                for (std::size_t i = 0; i < count; ++i) {
                    const double v = values[i];
                    block[i] = std::isfinite(v) ? to_wire<W>(v * k) : nan;
                }
            }
        }
        std::memcpy(out + first * sizeof(W), block.data(), count * sizeof(W));
    }
}

[[nodiscard]] constexpr std::size_t aligned8(std::size_t bytes) noexcept { return (bytes + 7) / 8 * 8; }

template <ScalePolicy P>
all_reduce_report all_reduce(std::span<ad::gradient<P>* const> grads, const all_reduce_options& options, reducer& world)
{
    const auto ranks = static_cast<std::size_t>(world.size());
    const traffic_stats before = world.traffic();
    all_reduce_report report;
    report.tensors = grads.size();

    // 1. Agreement: amax, non-finite flag, type and size of every tensor, in one max-reduction.
    std::vector<double> agreed(grads.size() * agreement_fields);
    for (std::size_t t = 0; t < grads.size(); ++t) {
        grads[t]->visit([&]<class T>(const ScaledArray<T, P>& array) {
            double amax = 0.0;
            bool non_finite = false;
            for (const auto& x : array.data()) {
                const double m = std::abs(static_cast<double>(scalify::detail::load(x)));
                if (!std::isfinite(m)) non_finite = true;
                else amax = m > amax ? m : amax;
            }
            if (array.scale() == 0.0f) amax = 0.0, non_finite = false;  // a zero-scale array is zeros
            const auto code = static_cast<double>(type_code<T>());
            const auto count = static_cast<double>(array.size());
            double* a = agreed.data() + t * agreement_fields;
            a[0] = amax * static_cast<double>(array.scale()), a[1] = non_finite ? 1.0 : 0.0;
            a[2] = code, a[3] = -code, a[4] = count, a[5] = -count;
            report.elements += array.size();
            report.storage_bytes += array.size() * sizeof(T);
        });
    }
    world.max(agreed);

    // 2. Each tensor in its wire type under the common scale, packed into one block.
    std::vector<int> wire(grads.size());
    std::vector<double> scale(grads.size());
    std::vector<std::size_t> offset(grads.size() + 1, 0);
    for (std::size_t t = 0; t < grads.size(); ++t) {
        const double* a = agreed.data() + t * agreement_fields;
        if (a[2] != -a[3] || a[4] != -a[5]) {
            const auto name = [](double code) {
                return with_type_code(static_cast<int>(code), []<class W>() { return ad::gradient_type_name<W>; });
            };
            SCALIFY_THROW(distributed_error(fmt::format(
                "all_reduce_gradients: gradient {} differs between ranks (types {} .. {}, {} .. {} elements)", t,
                name(-a[3]), name(a[2]), -a[5], a[4])));
        }
        report.found_non_finite = report.found_non_finite || a[1] != 0.0;
        wire[t] = options.wire ? type_code(*options.wire) : static_cast<int>(a[2]);  // every rank's type, checked above
        with_type_code(wire[t], [&]<class W>() {
            using A = accumulator_t<W>;
            const double limit = std::min(static_cast<double>(std::numeric_limits<W>::max()),
                                          static_cast<double>(std::numeric_limits<A>::max()) / static_cast<double>(ranks));
            scale[t] = common_scale(a[0], limit);
            offset[t + 1] = offset[t] + aligned8(static_cast<std::size_t>(a[4]) * sizeof(W));
        });
    }
    std::vector<std::byte> mine(offset.back());
    for (std::size_t t = 0; t < grads.size(); ++t) {
        const ad::detail::erased_array values = grads[t]->visit([](const auto& array) { return ad::detail::erase(array); });
        with_type_code(wire[t], [&]<class W>() { encode_block<W>(values, scale[t], mine.data() + offset[t]); });
    }
    report.wire_bytes = mine.size();

    // 3. Gather, and sum in rank order on every rank.
    std::vector<std::byte> all(mine.size() * ranks);
    world.all_gather(mine, all);
    for (std::size_t t = 0; t < grads.size(); ++t) {
        with_type_code(wire[t], [&]<class W>() {
            using A = accumulator_t<W>;
            const std::vector<std::size_t> shape = grads[t]->shape();
            xt::xarray<A> sum = xt::xarray<A>::from_shape(shape);
            std::vector<W> block(sum.size());
            A* out = sum.data();
            for (std::size_t r = 0; r < ranks; ++r) {
                if (!block.empty()) std::memcpy(block.data(), all.data() + r * mine.size() + offset[t], block.size() * sizeof(W));
                for (std::size_t i = 0; i < block.size(); ++i) {
                    const auto v = static_cast<A>(scalify::detail::load(block[i]));
                    out[i] = r == 0 ? v : out[i] + v;
                }
            }
            double result_scale = scale[t];
            if (options.average && ranks > 1) {
                if (std::has_single_bit(ranks) && result_scale / static_cast<double>(ranks) >= static_cast<double>(std::numeric_limits<float>::min())) {
                    result_scale /= static_cast<double>(ranks);  // exact: a power of two leaves the data alone
                } else {
                    for (A& v : sum) v /= static_cast<A>(ranks);
                }
            }
            *grads[t] = ad::gradient<P>(ScaledArray<A, P>(std::move(sum), static_cast<float>(result_scale)));
        });
    }
    report.payload_bytes = world.traffic().payload_bytes - before.payload_bytes;
    return report;
}

}  // namespace detail

/// Sums (options.average: averages) every gradient of the tree `grads` over the ranks of `world`,
/// in place (see the file comment); a tree as value_and_grad returns it, of ad::gradient leaves.
/// Every rank must call it with trees of the same structure.
template <class Tree>
all_reduce_report all_reduce_gradients(Tree& grads, const all_reduce_options& options = {}, reducer& world = current_reducer())
{
    using leaf = typename ad::detail::first_leaf<Tree>::type;
    static_assert(ad::detail::is_gradient_v<leaf>,
                  "all_reduce_gradients: the tree's leaves must be ad::gradient (what value_and_grad returns)");
    std::vector<leaf*> leaves;
    auto collect = [&](leaf& g, const leaf&) { leaves.push_back(&g); };
    ad::detail::tree_zip(grads, grads, collect);
    return detail::all_reduce(std::span<leaf* const>(leaves), options, world);
}

}  // namespace scalify::dist
