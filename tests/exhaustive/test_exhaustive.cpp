// Exhaustive sweeps: every one of the 2^32 float32 bit patterns through every rounding and
// saturation mode of every format, against the vendored truth tables (ml_dtypes, H100) and, for
// modes without a table, against oracles built from the format's decoded values.
#include "../support/reference_tables.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

using namespace scalify;
using test::run_cursor;

namespace {

// Small enough that a chunk's inputs, outputs and fake-quantised values stay in the L2 cache
// between the conversions and the checks.
constexpr std::size_t chunk = std::size_t{1} << 14;
constexpr std::uint64_t all_inputs = std::uint64_t{1} << 32;

struct mismatch_log {
    std::uint64_t count = 0;
    std::string first;
    void add(const char* what, std::uint32_t input, unsigned got, unsigned expected)
    {
        if (count++ < 5) {
            first += std::string(what) + ": input " + std::to_string(input) + " (0x" + fmt::format("{:08x}", input) +
                     ") gave 0x" + fmt::format("{:02x}", got) + ", expected 0x" + fmt::format("{:02x}", expected) + "\n";
        }
    }
};

template <class T>
bool is_nan_result(T x)
{
    if constexpr (T::format::has_nan) return isnan(x);
    else return (x.bits() & T::format::magnitude_mask) == 0;  // documented: NaN -> zero
}

/// Expected code for a non-NaN input under saturate_finite, from the no-saturation code.
template <class T>
unsigned saturated(unsigned code, std::uint32_t input)
{
    using F = typename T::format;
    const T value = T::from_bits(static_cast<typename F::storage_type>(code));
    if (isfinite(value)) return code;
    // Values with no code at all (negatives of unsigned formats, zero without a zero) stay NaN.
    if (!F::is_signed && ((input >> 31) != 0 || input == 0)) return code;
    if (!F::is_signed) return F::max_magnitude;
    return (input >> 31) != 0 ? (F::sign_mask | F::max_magnitude) : F::max_magnitude;
}

/// saturated() over whole runs of the nearest-even table, for formats without a satfinite table.
/// It reads of the input only its sign and whether it is +0, so runs split at 1 and at the sign
/// bit are answered by their first input.
template <class T>
std::vector<test::run> saturated_runs(const std::vector<test::run>& rne)
{
    std::vector<test::run> result;
    for (std::size_t k = 0; k < rne.size(); ++k) {
        const std::uint64_t end = k + 1 < rne.size() ? rne[k + 1].first : all_inputs;
        std::uint64_t first = rne[k].first;
        for (const std::uint64_t split : {std::uint64_t{1}, std::uint64_t{0x80000000u}}) {
            if (first >= split || split >= end) continue;
            result.push_back({first, saturated<T>(rne[k].code, static_cast<std::uint32_t>(first))});
            first = split;
        }
        result.push_back({first, saturated<T>(rne[k].code, static_cast<std::uint32_t>(first))});
    }
    return result;
}

/// OR of difference(i) over i < n: zero if and only if every one is. Inner blocks of fixed length,
/// which GCC vectorises at -O2 (this target's level), where a loop of run-time length stays scalar.
template <class Word, class Difference>
Word any_difference(std::size_t n, Difference difference)
{
    constexpr std::size_t block = 256;
    Word result = 0;
    std::size_t i = 0;
    for (; i + block <= n; i += block) {
        for (std::size_t j = 0; j < block; ++j) result |= static_cast<Word>(difference(i + j));
    }
    for (; i < n; ++i) result |= static_cast<Word>(difference(i));
    return result;
}

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }

/// One sweep over all 2^32 inputs checking nine conversions of format T at once. Every non-NaN
/// output is compared with runs of expected codes, a whole stretch of one code at a time (and a
/// fake-quantised value with that code's float); only a chunk where something differs is walked
/// again input by input, to name the mismatches. NaN inputs are always checked one by one.
template <class T>
void sweep(const std::string& rne_table, const std::string& satfinite_table = "")
{
    using F = typename T::format;
    using code_type = typename F::storage_type;
    const auto rne_runs = test::read_runs("fp8/" + rne_table);
    const auto sat_runs = satfinite_table.empty() ? saturated_runs<T>(rne_runs) : test::read_runs("fp8/" + satfinite_table);
    const auto rtz_runs = test::directed_oracle<F>(false, false).runs();
    const auto rtz_sat_runs = test::directed_oracle<F>(false, true).runs();
    run_cursor rne_cursor(rne_runs), sat_cursor(sat_runs), rtz_cursor(rtz_runs), rtz_sat_cursor(rtz_sat_runs);

    std::vector<float> in(chunk);
    std::vector<T> rne(chunk), sat(chunk), rtz(chunk), rtz_sat(chunk), sr_max(chunk);
    std::vector<float> fake_rne(chunk), fake_sat(chunk), fake_rtz(chunk), fake_rtz_sat(chunk);
    std::vector<unsigned> rne_expected, sat_expected, rtz_expected, rtz_sat_expected;
    mismatch_log log;
    std::uint64_t nan_inputs = 0, other_inputs = 0;

    // Whether any output of a stretch of the chunk differs from the stretch's expected code.
    const auto codes_differ = [](const std::vector<T>& codes, std::size_t first, std::size_t length, unsigned code) {
        const T* stretch = codes.data() + first;
        return any_difference<code_type>(length, [stretch, code](std::size_t i) { return stretch[i].bits() ^ code; }) != 0;
    };
    // The same with the fake-quantised values (where the format has them), against the code's float.
    const auto stretch_differs = [&](const std::vector<T>& codes, const std::vector<float>& fake, std::size_t first,
                                     std::size_t length, unsigned code) {
        bool differs = codes_differ(codes, first, length, code);
        if constexpr (F::has_zero) {
            const float* stretch = fake.data() + first;
            const std::uint32_t value = bits_of(static_cast<float>(T::from_bits(static_cast<code_type>(code))));
            differs |= any_difference<std::uint32_t>(length, [stretch, value](std::size_t i) { return bits_of(stretch[i]) ^ value; }) != 0;
        }
        return differs;
    };

    for (std::uint64_t begin = 0; begin < all_inputs; begin += chunk) {
        for (std::size_t i = 0; i < chunk; ++i) in[i] = std::bit_cast<float>(static_cast<std::uint32_t>(begin + i));
        convert_n<T, round_nearest_even, no_saturation>(std::span<const float>(in), std::span<T>(rne));
        convert_n<T, round_nearest_even, saturate_finite>(std::span<const float>(in), std::span<T>(sat));
        convert_n<T, round_toward_zero, no_saturation>(std::span<const float>(in), std::span<T>(rtz));
        convert_n<T, round_toward_zero, saturate_finite>(std::span<const float>(in), std::span<T>(rtz_sat));
        if constexpr (F::has_zero) {
            fake_quantize_n<T, round_nearest_even, no_saturation>(std::span<const float>(in), std::span<float>(fake_rne));
            fake_quantize_n<T, round_nearest_even, saturate_finite>(std::span<const float>(in), std::span<float>(fake_sat));
            fake_quantize_n<T, round_toward_zero, no_saturation>(std::span<const float>(in), std::span<float>(fake_rtz));
            fake_quantize_n<T, round_toward_zero, saturate_finite>(std::span<const float>(in), std::span<float>(fake_rtz_sat));
        }
        for (std::size_t i = 0; i < chunk; ++i) {
            // All-ones random bits never round up: stochastic rounding must then truncate.
            sr_max[i] = convert<T, round_stochastic>(in[i], 0xffffffffu);
        }

        // Within one sign the NaN inputs are the top of the range, so a chunk (which never spans
        // both signs) holds other inputs first, then NaNs.
        const std::uint64_t nan_start = (begin & 0x80000000u) | 0x7f800001u;
        const std::size_t others = nan_start <= begin ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(chunk, nan_start - begin));
        other_inputs += others;

        // Copies of the cursors replay this chunk's runs if a mismatch needs naming.
        run_cursor rne_replay = rne_cursor, sat_replay = sat_cursor, rtz_replay = rtz_cursor, rtz_sat_replay = rtz_sat_cursor;
        bool differs = false;
        rne_cursor.for_each_run(begin, others, [&](std::size_t first, std::size_t length, unsigned code) {
            differs |= stretch_differs(rne, fake_rne, first, length, code);
        });
        sat_cursor.for_each_run(begin, others, [&](std::size_t first, std::size_t length, unsigned code) {
            differs |= stretch_differs(sat, fake_sat, first, length, code);
        });
        rtz_cursor.for_each_run(begin, others, [&](std::size_t first, std::size_t length, unsigned code) {
            differs |= stretch_differs(rtz, fake_rtz, first, length, code);
            differs |= codes_differ(sr_max, first, length, code);
        });
        rtz_sat_cursor.for_each_run(begin, others, [&](std::size_t first, std::size_t length, unsigned code) {
            differs |= stretch_differs(rtz_sat, fake_rtz_sat, first, length, code);
        });

        // Input by input: the NaNs always, the others where a stretch differed.
        const std::size_t from = differs ? 0 : others;
        if (differs) {
            rne_replay.fill(begin, others, rne_expected);
            sat_replay.fill(begin, others, sat_expected);
            rtz_replay.fill(begin, others, rtz_expected);
            rtz_sat_replay.fill(begin, others, rtz_sat_expected);
        }
        for (std::size_t i = from; i < chunk; ++i) {
            const auto input = static_cast<std::uint32_t>(begin + i);
            if constexpr (F::has_zero) {
                // Fake quantisation is its own code path: it must equal decode(encode(x)) bit for bit.
                if (bits_of(fake_rne[i]) != bits_of(static_cast<float>(rne[i])))
                    log.add("fake_quantize rne", input, bits_of(fake_rne[i]), bits_of(static_cast<float>(rne[i])));
                if (bits_of(fake_sat[i]) != bits_of(static_cast<float>(sat[i])))
                    log.add("fake_quantize satfinite", input, bits_of(fake_sat[i]), bits_of(static_cast<float>(sat[i])));
                if (bits_of(fake_rtz[i]) != bits_of(static_cast<float>(rtz[i])))
                    log.add("fake_quantize rtz", input, bits_of(fake_rtz[i]), bits_of(static_cast<float>(rtz[i])));
                if (bits_of(fake_rtz_sat[i]) != bits_of(static_cast<float>(rtz_sat[i])))
                    log.add("fake_quantize rtz satfinite", input, bits_of(fake_rtz_sat[i]), bits_of(static_cast<float>(rtz_sat[i])));
            }
            if (i >= others) {
                nan_inputs += (input & 0x7fffffffu) > 0x7f800000u ? 1 : 0;
                if (!is_nan_result(rne[i])) log.add("rne NaN", input, rne[i].bits(), F::canonical_nan);
                if (!is_nan_result(sat[i])) log.add("satfinite NaN", input, sat[i].bits(), F::canonical_nan);
                if (!is_nan_result(rtz[i])) log.add("rtz NaN", input, rtz[i].bits(), F::canonical_nan);
                if (!is_nan_result(sr_max[i])) log.add("stochastic NaN", input, sr_max[i].bits(), F::canonical_nan);
                continue;
            }
            if (rne[i].bits() != rne_expected[i]) log.add("rne", input, rne[i].bits(), rne_expected[i]);
            if (sat[i].bits() != sat_expected[i]) log.add("satfinite", input, sat[i].bits(), sat_expected[i]);
            if (rtz[i].bits() != rtz_expected[i]) log.add("rtz", input, rtz[i].bits(), rtz_expected[i]);
            if (rtz_sat[i].bits() != rtz_sat_expected[i]) log.add("rtz satfinite", input, rtz_sat[i].bits(), rtz_sat_expected[i]);
            if (sr_max[i].bits() != rtz_expected[i]) log.add("stochastic(all ones)", input, sr_max[i].bits(), rtz_expected[i]);
        }
    }
    INFO(log.first);
    // Every input counted exactly once, and the NaNs by their bits: the split above is right.
    CHECK(nan_inputs == 2 * ((std::uint64_t{1} << 23) - 1));
    CHECK(nan_inputs + other_inputs == all_inputs);
    CHECK(log.count == 0);
}

}  // namespace

TEST_CASE("float8_e4m3fn: all float32 inputs", "[exhaustive]") { sweep<float8_e4m3fn>("f32_to_e4m3fn.rne.txt", "f32_to_e4m3fn.satfinite.txt"); }
TEST_CASE("float8_e5m2: all float32 inputs", "[exhaustive]") { sweep<float8_e5m2>("f32_to_e5m2.rne.txt", "f32_to_e5m2.satfinite.txt"); }
TEST_CASE("float8_e4m3fnuz: all float32 inputs", "[exhaustive]") { sweep<float8_e4m3fnuz>("f32_to_e4m3fnuz.rne.txt"); }
TEST_CASE("float8_e5m2fnuz: all float32 inputs", "[exhaustive]") { sweep<float8_e5m2fnuz>("f32_to_e5m2fnuz.rne.txt"); }
TEST_CASE("float8_e4m3b11fnuz: all float32 inputs", "[exhaustive]") { sweep<float8_e4m3b11fnuz>("f32_to_e4m3b11fnuz.rne.txt"); }
TEST_CASE("float8_e3m4: all float32 inputs", "[exhaustive]") { sweep<float8_e3m4>("f32_to_e3m4.rne.txt"); }
TEST_CASE("float8_e4m3: all float32 inputs", "[exhaustive]") { sweep<float8_e4m3>("f32_to_e4m3.rne.txt"); }
TEST_CASE("float8_e8m0fnu: all float32 inputs", "[exhaustive]") { sweep<float8_e8m0fnu>("f32_to_e8m0fnu.rne.txt"); }
TEST_CASE("float6_e2m3fn: all float32 inputs", "[exhaustive]") { sweep<float6_e2m3fn>("f32_to_e2m3fn.rne.txt"); }
TEST_CASE("float6_e3m2fn: all float32 inputs", "[exhaustive]") { sweep<float6_e3m2fn>("f32_to_e3m2fn.rne.txt"); }
TEST_CASE("float4_e2m1fn: all float32 inputs", "[exhaustive]") { sweep<float4_e2m1fn>("f32_to_e2m1fn.rne.txt"); }

namespace {

/// Eigen's own float -> half / bfloat16 conversions (nearest-even) are the oracle for the 16-bit
/// formats, which the shared tables do not cover: equal on every non-NaN input, NaN to NaN.
template <class T>
void sweep_against_eigen()
{
    std::vector<float> in(chunk);
    std::vector<T> ours(chunk);
    mismatch_log log;
    for (std::uint64_t begin = 0; begin < (std::uint64_t{1} << 32); begin += chunk) {
        for (std::size_t i = 0; i < chunk; ++i) in[i] = std::bit_cast<float>(static_cast<std::uint32_t>(begin + i));
        convert_n<T>(std::span<const float>(in), std::span<T>(ours));
        for (std::size_t i = 0; i < chunk; ++i) {
            const auto input = static_cast<std::uint32_t>(begin + i);
            const auto got = std::bit_cast<std::uint16_t>(ours[i]);
            if ((input & 0x7fffffffu) > 0x7f800000u) {
                if ((got & 0x7fffu) <= (std::bit_cast<std::uint16_t>(std::numeric_limits<T>::infinity()) & 0x7fffu))
                    log.add("NaN", input, got, 0);
                continue;
            }
            const auto expected = std::bit_cast<std::uint16_t>(T(in[i]));
            if (got != expected) log.add("rne", input, got, expected);
        }
    }
    INFO(log.first);
    CHECK(log.count == 0);
}

}  // namespace

TEST_CASE("Eigen::half: all float32 inputs", "[exhaustive]") { sweep_against_eigen<Eigen::half>(); }
TEST_CASE("Eigen::bfloat16: all float32 inputs", "[exhaustive]") { sweep_against_eigen<Eigen::bfloat16>(); }
