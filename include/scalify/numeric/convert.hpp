#pragma once
/// \file convert.hpp
/// convert<To, Rounding, Saturation>(x) and the bulk convert_n over contiguous ranges.
///
///     auto d = convert<float8_e4m3fn, round_nearest_even, saturate_finite>(x);  // = H100 cvt.rn.satfinite
///     convert_n<float8_e5m2, round_stochastic>(in, out, seed);                  // reproducible for a seed

#include <scalify/detail/counter_random.hpp>
#include <scalify/detail/encode.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/minifloat.hpp>
#include <scalify/numeric/policies.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <string>
#include <type_traits>

namespace scalify {

/// How convert reaches a type's bits. Specialised for minifloat here and for Eigen::half and
/// Eigen::bfloat16 in <scalify/numeric/eigen.hpp>; a user may add other 8/16-bit float types.
template <class T>
struct float_traits;

template <FloatFormat F>
struct float_traits<minifloat<F>> {
    using format = F;
    [[nodiscard]] static constexpr minifloat<F> from_bits(typename F::storage_type bits) noexcept
    {
        return minifloat<F>::from_bits(bits);
    }
    [[nodiscard]] static constexpr float to_float(minifloat<F> x) noexcept { return static_cast<float>(x); }
};

/// A type convert<> can round into: it has a float_traits with a format.
template <class T>
concept EncodedFloat = requires { typename float_traits<std::remove_cv_t<T>>::format; };

namespace detail {

template <class T>
concept ieee_source = std::same_as<T, float> || std::same_as<T, double>;

/// What the engine reads: float and double as they are, integers through double, everything
/// else (minifloats, Eigen::half, Eigen::bfloat16) widened to float, which is exact.
template <class From>
[[nodiscard]] constexpr auto engine_input(const From& x) noexcept
{
    if constexpr (ieee_source<From>) return x;
    else if constexpr (std::integral<From>) return static_cast<double>(x);
    else if constexpr (EncodedFloat<From>) return float_traits<From>::to_float(x);
    else return static_cast<float>(x);
}

template <class To, rounding_mode Rounding, saturation_mode Saturation, class From>
[[nodiscard]] constexpr To convert_one(const From& x, std::uint32_t random_bits) noexcept
{
    if constexpr (EncodedFloat<To>) {
        using traits = float_traits<To>;
        return traits::from_bits(
            encode<typename traits::format, Rounding, Saturation>(engine_input(x), random_bits));
    } else {
        static_assert(std::floating_point<To>, "convert<To>: To must be a minifloat, Eigen::half, "
                                               "Eigen::bfloat16, float or double");
        static_assert(Rounding == rounding_mode::nearest_even || !std::same_as<From, double> || !std::same_as<To, float>,
                      "convert<float> from double rounds to nearest even only");
        return static_cast<To>(engine_input(x));  // exact widening for every encoded source
    }
}

struct deduce_from_output {};

template <class To, class Out>
using convert_target = std::conditional_t<std::same_as<To, deduce_from_output>,
                                          std::ranges::range_value_t<Out>, To>;

template <class To, class In, class Out>
constexpr void check_ranges(const In& in, const Out& out)
{
    static_assert(std::same_as<To, std::ranges::range_value_t<Out>>,
                  "convert_n<To>: the output range's element type must be To");
    static_assert(!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<Out>>>,
                  "convert_n: the output range must be writable");
    if (std::ranges::size(in) != std::ranges::size(out)) {
        SCALIFY_THROW(shape_error("convert_n: input has " + std::to_string(std::ranges::size(in)) +
                                  " elements but output has " + std::to_string(std::ranges::size(out))));
    }
}

/// The common length; never more than either range holds, even if a user's SCALIFY_THROW returns.
template <class In, class Out>
[[nodiscard]] constexpr std::size_t checked_size(const In& in, const Out& out) noexcept
{
    return std::min<std::size_t>(std::ranges::size(in), std::ranges::size(out));
}

}  // namespace detail

/// One value, deterministic rounding. From: float, double, an integer, a minifloat,
/// Eigen::half or Eigen::bfloat16 (one rounding in every case but integers beyond 2^53).
template <class To, RoundingPolicy Rounding = round_nearest_even, SaturationPolicy Saturation = no_saturation,
          class From>
    requires DeterministicRounding<Rounding>
[[nodiscard]] constexpr To convert(const From& x) noexcept
{
    return detail::convert_one<To, Rounding::mode, Saturation::mode>(x, 0);
}

/// One value, stochastic rounding with the caller's 32 random bits.
template <class To, RoundingPolicy Rounding, SaturationPolicy Saturation = no_saturation, class From>
    requires StochasticRounding<Rounding> && EncodedFloat<To>
[[nodiscard]] constexpr To convert(const From& x, std::uint32_t random_bits) noexcept
{
    return detail::convert_one<To, Rounding::mode, Saturation::mode>(x, random_bits);
}

/// Element-wise convert of a contiguous range into another of the same length
/// (shape_error otherwise). To defaults to the output's element type, so a decode reads
/// `convert_n(std::span<const float8_e4m3fn>(codes), std::span<float>(values))`.
template <class To = detail::deduce_from_output, RoundingPolicy Rounding = round_nearest_even,
          SaturationPolicy Saturation = no_saturation, std::ranges::contiguous_range In,
          std::ranges::contiguous_range Out>
    requires DeterministicRounding<Rounding> && std::ranges::sized_range<In> && std::ranges::sized_range<Out>
void convert_n(In&& in, Out&& out)
{
    using target = detail::convert_target<To, Out>;
    detail::check_ranges<target>(in, out);
    const auto* source = std::ranges::data(in);
    auto* destination = std::ranges::data(out);
    const std::size_t n = detail::checked_size(in, out);
    for (std::size_t i = 0; i < n; ++i) {
        destination[i] = detail::convert_one<target, Rounding::mode, Saturation::mode>(source[i], 0);
    }
}

/// Stochastic bulk convert. Element i uses the 32 random bits of a counter-based generator at
/// (seed, first_index + i): results do not depend on how a caller chunks or threads the work,
/// provided each chunk passes its offset as first_index.
template <class To, RoundingPolicy Rounding, SaturationPolicy Saturation = no_saturation,
          std::ranges::contiguous_range In, std::ranges::contiguous_range Out>
    requires StochasticRounding<Rounding> && std::ranges::sized_range<In> && std::ranges::sized_range<Out>
void convert_n(In&& in, Out&& out, std::uint64_t seed, std::uint64_t first_index = 0)
{
    detail::check_ranges<To>(in, out);
    const auto* source = std::ranges::data(in);
    auto* destination = std::ranges::data(out);
    const std::size_t n = detail::checked_size(in, out);
    const detail::counter_random random(seed);
    std::size_t done = 0;
    while (done < n) {
        // Split where the upper 32 bits of the index change, so the inner loop counts in 32 bits.
        const std::uint64_t index = first_index + done;
        const auto low = static_cast<std::uint32_t>(index);
        const std::uint64_t to_boundary = (std::uint64_t{1} << 32) - low;
        const std::size_t count = static_cast<std::size_t>(std::min<std::uint64_t>(n - done, to_boundary));
        const auto block = random.block(static_cast<std::uint32_t>(index >> 32));
        const auto* block_source = source + done;
        auto* block_destination = destination + done;
        for (std::size_t i = 0; i < count; ++i) {
            block_destination[i] = detail::convert_one<To, Rounding::mode, Saturation::mode>(
                block_source[i], block(low + static_cast<std::uint32_t>(i)));
        }
        done += count;
    }
}

/// Quantise-dequantise ("fake quantisation"): out[i] = float(convert<T, Rounding, Saturation>(in[i])),
/// in one vectorisable loop with no table lookups. T: a minifloat format that has a zero.
template <class T, RoundingPolicy Rounding = round_nearest_even, SaturationPolicy Saturation = no_saturation,
          std::ranges::contiguous_range In, std::ranges::contiguous_range Out>
    requires DeterministicRounding<Rounding> && Minifloat<T> &&
             std::same_as<std::ranges::range_value_t<In>, float> && std::same_as<std::ranges::range_value_t<Out>, float>
void fake_quantize_n(In&& in, Out&& out)
{
    using F = typename T::format;
    detail::check_ranges<float>(in, out);
    const float* source = std::ranges::data(in);
    float* destination = std::ranges::data(out);
    const std::size_t n = detail::checked_size(in, out);
    for (std::size_t i = 0; i < n; ++i) {
        if constexpr (detail::has_fast_fake_quantize<F, Rounding::mode>) {
            destination[i] = detail::fake_quantize<F, Rounding::mode, Saturation::mode>(source[i]);
        } else {
            destination[i] = detail::decode_branchless<F>(detail::encode<F, Rounding::mode, Saturation::mode>(source[i]));
        }
    }
}

}  // namespace scalify
