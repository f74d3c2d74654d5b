// Exhaustive sweeps: every one of the 2^32 float32 bit patterns through every rounding and
// saturation mode of every format, against the vendored truth tables (ml_dtypes, H100) and, for
// modes without a table, against oracles built from the format's decoded values.
//
// SCALIFY_EXHAUSTIVE_STRIDE (default 1: every input) visits only the inputs 0, s, 2s, ... below
// 2^32, for emulated builds (cmake/cross_test.cmake: ARM64 under qemu), where all 2^32 take too
// long. s must be odd, so that the inputs visited meet every residue modulo any power of two, and
// at most 2^9, so that the 2^32 / s of them meet all 2^23 mantissa patterns (the rounding bits of
// every format included) and every exponent of both signs. The test names say which inputs ran.
#include "../support/reference_tables.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
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

#ifndef SCALIFY_EXHAUSTIVE_STRIDE
#define SCALIFY_EXHAUSTIVE_STRIDE 1
#endif
constexpr std::uint64_t stride = SCALIFY_EXHAUSTIVE_STRIDE;
static_assert(stride == 1 || (stride % 2 == 1 && stride <= 512),
              "SCALIFY_EXHAUSTIVE_STRIDE must be 1, or odd and at most 512 (every mantissa pattern visited)");
/// How many inputs a strided sweep visits, and how many of them are NaNs (the multiples of the
/// stride in 0x7f800001..0x7fffffff and 0xff800001..0xffffffff).
constexpr std::uint64_t strided_inputs = (all_inputs + stride - 1) / stride;
constexpr std::uint64_t strided_nans = (0x7fffffffu / stride - 0x7f800000u / stride) + (0xffffffffu / stride - 0xff800000u / stride);

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

/// The input visited k-th: k itself natively, k * stride in a strided build.
std::uint32_t input_at(std::uint64_t k) { return static_cast<std::uint32_t>(k * stride); }

/// The nine conversions of one chunk of inputs, each kept for the checks.
template <class T>
struct conversions {
    std::vector<float> in;
    std::vector<T> rne, sat, rtz, rtz_sat, sr_max;
    std::vector<float> fake_rne, fake_sat, fake_rtz, fake_rtz_sat;

    conversions()
        : in(chunk), rne(chunk), sat(chunk), rtz(chunk), rtz_sat(chunk), sr_max(chunk), fake_rne(chunk), fake_sat(chunk),
          fake_rtz(chunk), fake_rtz_sat(chunk)
    {
    }

    /// Converts the n inputs visited from the k-th on.
    void run(std::uint64_t k, std::size_t n)
    {
        for (std::size_t i = 0; i < n; ++i) in[i] = std::bit_cast<float>(input_at(k + i));
        const std::span<const float> x(in.data(), n);
        convert_n<T, round_nearest_even, no_saturation>(x, std::span<T>(rne.data(), n));
        convert_n<T, round_nearest_even, saturate_finite>(x, std::span<T>(sat.data(), n));
        convert_n<T, round_toward_zero, no_saturation>(x, std::span<T>(rtz.data(), n));
        convert_n<T, round_toward_zero, saturate_finite>(x, std::span<T>(rtz_sat.data(), n));
        if constexpr (T::format::has_zero) {
            fake_quantize_n<T, round_nearest_even, no_saturation>(x, std::span<float>(fake_rne.data(), n));
            fake_quantize_n<T, round_nearest_even, saturate_finite>(x, std::span<float>(fake_sat.data(), n));
            fake_quantize_n<T, round_toward_zero, no_saturation>(x, std::span<float>(fake_rtz.data(), n));
            fake_quantize_n<T, round_toward_zero, saturate_finite>(x, std::span<float>(fake_rtz_sat.data(), n));
        }
        // All-ones random bits never round up: stochastic rounding must then truncate. (Through
        // local pointers: a one-byte code store may alias the vectors' own pointers.)
        const float* from = in.data();
        T* to = sr_max.data();
        for (std::size_t i = 0; i < n; ++i) to[i] = convert<T, round_stochastic>(from[i], 0xffffffffu);
    }
};

/// The codes a non-NaN input must give: round-to-nearest-even and toward zero, each with and
/// without saturate_finite (stochastic with all-ones bits must give the toward-zero one).
struct expected_codes {
    unsigned rne, sat, rtz, rtz_sat;
};

/// Checks input i of a chunk on its own, logging each mismatch: fake quantisation against
/// decode(encode(x)), then NaN outputs for a NaN input (no expected codes) or the expected codes.
/// Inlined: the native sweep calls it for each of its 2^24 NaN inputs.
template <class T>
[[gnu::always_inline]] inline void check_input(const conversions<T>& out, std::size_t i, std::uint32_t input,
                                               const std::optional<expected_codes>& expected, mismatch_log& log)
{
    using F = typename T::format;
    if constexpr (F::has_zero) {
        // Fake quantisation is its own code path: it must equal decode(encode(x)) bit for bit.
        if (bits_of(out.fake_rne[i]) != bits_of(static_cast<float>(out.rne[i])))
            log.add("fake_quantize rne", input, bits_of(out.fake_rne[i]), bits_of(static_cast<float>(out.rne[i])));
        if (bits_of(out.fake_sat[i]) != bits_of(static_cast<float>(out.sat[i])))
            log.add("fake_quantize satfinite", input, bits_of(out.fake_sat[i]), bits_of(static_cast<float>(out.sat[i])));
        if (bits_of(out.fake_rtz[i]) != bits_of(static_cast<float>(out.rtz[i])))
            log.add("fake_quantize rtz", input, bits_of(out.fake_rtz[i]), bits_of(static_cast<float>(out.rtz[i])));
        if (bits_of(out.fake_rtz_sat[i]) != bits_of(static_cast<float>(out.rtz_sat[i])))
            log.add("fake_quantize rtz satfinite", input, bits_of(out.fake_rtz_sat[i]), bits_of(static_cast<float>(out.rtz_sat[i])));
    }
    if (!expected) {
        if (!is_nan_result(out.rne[i])) log.add("rne NaN", input, out.rne[i].bits(), F::canonical_nan);
        if (!is_nan_result(out.sat[i])) log.add("satfinite NaN", input, out.sat[i].bits(), F::canonical_nan);
        if (!is_nan_result(out.rtz[i])) log.add("rtz NaN", input, out.rtz[i].bits(), F::canonical_nan);
        if (!is_nan_result(out.sr_max[i])) log.add("stochastic NaN", input, out.sr_max[i].bits(), F::canonical_nan);
        return;
    }
    if (out.rne[i].bits() != expected->rne) log.add("rne", input, out.rne[i].bits(), expected->rne);
    if (out.sat[i].bits() != expected->sat) log.add("satfinite", input, out.sat[i].bits(), expected->sat);
    if (out.rtz[i].bits() != expected->rtz) log.add("rtz", input, out.rtz[i].bits(), expected->rtz);
    if (out.rtz_sat[i].bits() != expected->rtz_sat) log.add("rtz satfinite", input, out.rtz_sat[i].bits(), expected->rtz_sat);
    if (out.sr_max[i].bits() != expected->rtz) log.add("stochastic(all ones)", input, out.sr_max[i].bits(), expected->rtz);
}

/// Expected codes at increasing inputs, from runs.
class run_lookup {
public:
    explicit run_lookup(const std::vector<test::run>& runs) : m_runs(runs) {}
    unsigned operator()(std::uint64_t input)
    {
        while (m_index + 1 < m_runs.size() && m_runs[m_index + 1].first <= input) ++m_index;
        return m_runs[m_index].code;
    }

private:
    const std::vector<test::run>& m_runs;
    std::size_t m_index = 0;
};

/// sweep() over every stride-th input: the same conversions and checks, input by input (there
/// are only 2^32 / stride of them).
template <class T>
void strided_sweep(const std::vector<test::run>& rne_runs, const std::vector<test::run>& sat_runs,
                   const std::vector<test::run>& rtz_runs, const std::vector<test::run>& rtz_sat_runs)
{
    run_lookup rne_expected(rne_runs), sat_expected(sat_runs), rtz_expected(rtz_runs), rtz_sat_expected(rtz_sat_runs);
    conversions<T> out;
    mismatch_log log;
    std::uint64_t nan_inputs = 0, other_inputs = 0;
    for (std::uint64_t k = 0; k < strided_inputs; k += chunk) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, strided_inputs - k));
        out.run(k, n);
        for (std::size_t i = 0; i < n; ++i) {
            const std::uint32_t input = input_at(k + i);
            if ((input & 0x7fffffffu) > 0x7f800000u) {
                ++nan_inputs;
                check_input(out, i, input, std::nullopt, log);
                continue;
            }
            ++other_inputs;
            check_input(out, i, input,
                        expected_codes{rne_expected(input), sat_expected(input), rtz_expected(input), rtz_sat_expected(input)}, log);
        }
    }
    INFO("every " << stride << "th float32 input\n" << log.first);
    CHECK(nan_inputs == strided_nans);
    CHECK(nan_inputs + other_inputs == strided_inputs);
    CHECK(log.count == 0);
}

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
    if constexpr (stride > 1) {
        strided_sweep<T>(rne_runs, sat_runs, rtz_runs, rtz_sat_runs);
        return;
    }
    run_cursor rne_cursor(rne_runs), sat_cursor(sat_runs), rtz_cursor(rtz_runs), rtz_sat_cursor(rtz_sat_runs);

    conversions<T> out;
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
        out.run(begin, chunk);

        // Within one sign the NaN inputs are the top of the range, so a chunk (which never spans
        // both signs) holds other inputs first, then NaNs.
        const std::uint64_t nan_start = (begin & 0x80000000u) | 0x7f800001u;
        const std::size_t others = nan_start <= begin ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(chunk, nan_start - begin));
        other_inputs += others;

        // Copies of the cursors replay this chunk's runs if a mismatch needs naming.
        run_cursor rne_replay = rne_cursor, sat_replay = sat_cursor, rtz_replay = rtz_cursor, rtz_sat_replay = rtz_sat_cursor;
        bool differs = false;
        rne_cursor.for_each_run(begin, others, [&](std::size_t first, std::size_t length, unsigned code) {
            differs |= stretch_differs(out.rne, out.fake_rne, first, length, code);
        });
        sat_cursor.for_each_run(begin, others, [&](std::size_t first, std::size_t length, unsigned code) {
            differs |= stretch_differs(out.sat, out.fake_sat, first, length, code);
        });
        rtz_cursor.for_each_run(begin, others, [&](std::size_t first, std::size_t length, unsigned code) {
            differs |= stretch_differs(out.rtz, out.fake_rtz, first, length, code);
            differs |= codes_differ(out.sr_max, first, length, code);
        });
        rtz_sat_cursor.for_each_run(begin, others, [&](std::size_t first, std::size_t length, unsigned code) {
            differs |= stretch_differs(out.rtz_sat, out.fake_rtz_sat, first, length, code);
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
            const std::uint32_t input = input_at(begin + i);
            if (i >= others) {
                nan_inputs += (input & 0x7fffffffu) > 0x7f800000u ? 1 : 0;
                check_input(out, i, input, std::nullopt, log);
                continue;
            }
            check_input(out, i, input, expected_codes{rne_expected[i], sat_expected[i], rtz_expected[i], rtz_sat_expected[i]}, log);
        }
    }
    INFO(log.first);
    // Every input counted exactly once, and the NaNs by their bits: the split above is right.
    CHECK(nan_inputs == 2 * ((std::uint64_t{1} << 23) - 1));
    CHECK(nan_inputs + other_inputs == all_inputs);
    CHECK(log.count == 0);
}

}  // namespace

// The names say which inputs a sweep visits: all of them, or every SCALIFY_EXHAUSTIVE_STRIDE-th.
#define SCALIFY_SWEEP_STR_(x) #x
#define SCALIFY_SWEEP_STR(x) SCALIFY_SWEEP_STR_(x)
#if SCALIFY_EXHAUSTIVE_STRIDE == 1
#define SCALIFY_SWEPT "all float32 inputs"
#else
#define SCALIFY_SWEPT "every " SCALIFY_SWEEP_STR(SCALIFY_EXHAUSTIVE_STRIDE) "th float32 input"
#endif

TEST_CASE("float8_e4m3fn: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float8_e4m3fn>("f32_to_e4m3fn.rne.txt", "f32_to_e4m3fn.satfinite.txt"); }
TEST_CASE("float8_e5m2: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float8_e5m2>("f32_to_e5m2.rne.txt", "f32_to_e5m2.satfinite.txt"); }
TEST_CASE("float8_e4m3fnuz: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float8_e4m3fnuz>("f32_to_e4m3fnuz.rne.txt"); }
TEST_CASE("float8_e5m2fnuz: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float8_e5m2fnuz>("f32_to_e5m2fnuz.rne.txt"); }
TEST_CASE("float8_e4m3b11fnuz: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float8_e4m3b11fnuz>("f32_to_e4m3b11fnuz.rne.txt"); }
TEST_CASE("float8_e3m4: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float8_e3m4>("f32_to_e3m4.rne.txt"); }
TEST_CASE("float8_e4m3: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float8_e4m3>("f32_to_e4m3.rne.txt"); }
TEST_CASE("float8_e8m0fnu: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float8_e8m0fnu>("f32_to_e8m0fnu.rne.txt"); }
TEST_CASE("float6_e2m3fn: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float6_e2m3fn>("f32_to_e2m3fn.rne.txt"); }
TEST_CASE("float6_e3m2fn: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float6_e3m2fn>("f32_to_e3m2fn.rne.txt"); }
TEST_CASE("float4_e2m1fn: " SCALIFY_SWEPT, "[exhaustive]") { sweep<float4_e2m1fn>("f32_to_e2m1fn.rne.txt"); }

namespace {

/// Eigen's own float -> half / bfloat16 conversions (nearest-even) are the oracle for the 16-bit
/// formats, which the shared tables do not cover: equal on every non-NaN input, NaN to NaN.
template <class T>
void sweep_against_eigen()
{
    std::vector<float> in(chunk);
    std::vector<T> ours(chunk);
    mismatch_log log;
    // Every stride-th input (all of them natively): inputs k * stride for k < strided_inputs.
    for (std::uint64_t begin = 0; begin < strided_inputs; begin += chunk) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, strided_inputs - begin));
        for (std::size_t i = 0; i < n; ++i) in[i] = std::bit_cast<float>(input_at(begin + i));
        convert_n<T>(std::span<const float>(in.data(), n), std::span<T>(ours.data(), n));
        for (std::size_t i = 0; i < n; ++i) {
            const std::uint32_t input = input_at(begin + i);
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
    INFO("every " << stride << "th float32 input\n" << log.first);
    CHECK(log.count == 0);
}

}  // namespace

TEST_CASE("Eigen::half: " SCALIFY_SWEPT, "[exhaustive]") { sweep_against_eigen<Eigen::half>(); }
TEST_CASE("Eigen::bfloat16: " SCALIFY_SWEPT, "[exhaustive]") { sweep_against_eigen<Eigen::bfloat16>(); }
