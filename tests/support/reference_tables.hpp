#pragma once
// Readers for the vendored truth tables in tests/data/fp8 (format in tests/data/README.md),
// and oracles built from a format's decoded values for modes that have no table.

#include <scalify/scalify.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace scalify::test {

/// One run of a float32 -> code map: every input from `first` up to the next run's first maps to `code`.
struct run {
    std::uint64_t first;
    unsigned code;
};

inline std::string data_path(const std::string& relative)
{
    // Appended in place: GCC 12 at -O1 flags `std::string(dir) + "/" + relative` with a false
    // -Warray-bounds (its own bug in the inlined move of a temporary string).
    std::string path = SCALIFY_TEST_DATA_DIR;
    path += '/';
    path += relative;
    return path;
}

inline std::vector<run> read_runs(const std::string& relative)
{
    std::ifstream in(data_path(relative));
    if (!in) throw std::runtime_error("cannot open " + data_path(relative));
    std::vector<run> runs;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream fields(line);
        std::uint64_t first = 0;
        unsigned code = 0;
        fields >> std::hex >> first >> code;
        runs.push_back({first, code});
    }
    return runs;
}

/// code -> float32 bits, from a decode_<format>.txt file.
inline std::vector<std::uint32_t> read_decode(const std::string& relative)
{
    std::vector<std::uint32_t> values;
    for (const run& r : read_runs(relative)) {
        if (r.first != values.size()) throw std::runtime_error("decode table out of order: " + relative);
        values.push_back(static_cast<std::uint32_t>(r.code));
    }
    return values;
}

/// Expand runs into a per-input code for inputs [begin, begin + count). Calls move forward
/// through the runs; a copy of the cursor can replay the same inputs.
class run_cursor {
public:
    explicit run_cursor(const std::vector<run>& runs) : m_runs(runs) {}

    /// visit(offset, length, code) for each stretch of one run within [begin, begin + count), in
    /// order, offsets counted from begin: lets a caller check a whole stretch against one code.
    template <class Visit>
    void for_each_run(std::uint64_t begin, std::size_t count, Visit&& visit)
    {
        const std::uint64_t end = begin + count;
        for (std::uint64_t input = begin; input < end;) {
            while (m_index + 1 < m_runs.size() && m_runs[m_index + 1].first <= input) ++m_index;
            const std::uint64_t next = m_index + 1 < m_runs.size() ? std::min(m_runs[m_index + 1].first, end) : end;
            visit(static_cast<std::size_t>(input - begin), static_cast<std::size_t>(next - input), m_runs[m_index].code);
            input = next;
        }
    }

    void fill(std::uint64_t begin, std::size_t count, std::vector<unsigned>& out)
    {
        out.resize(count);
        for_each_run(begin, count, [&out](std::size_t offset, std::size_t length, unsigned code) {
            std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(offset), length, code);
        });
    }

private:
    const std::vector<run>& m_runs;
    std::size_t m_index = 0;
};

/// Directed rounding (toward zero, or away from zero) of float32 inputs, computed from the
/// format's own decoded values: an oracle independent of the conversion engine. Query it with
/// inputs in increasing magnitude order within each sign (a cursor walks the value list).
template <FloatFormat F>
class directed_oracle {
public:
    directed_oracle(bool away_from_zero, bool saturate) : m_away(away_from_zero)
    {
        using T = minifloat<F>;
        for (unsigned code = 0; code <= F::max_magnitude; ++code) {
            m_values.push_back(std::bit_cast<std::uint32_t>(static_cast<float>(T::from_bits(static_cast<typename F::storage_type>(code)))));
        }
        const double max_value = static_cast<double>(T::from_bits(static_cast<typename F::storage_type>(F::max_magnitude)));
        const int max_exponent = static_cast<int>(F::max_magnitude >> F::mantissa_bits) - F::bias;
        // With an unbounded exponent, the value after max: truncation overflows from there on.
        m_overflow_bits = std::bit_cast<std::uint32_t>(static_cast<float>(max_value + std::ldexp(1.0, max_exponent - F::mantissa_bits)));
        m_overflow_code = saturate || !F::has_nan ? F::max_magnitude
                          : F::has_infinity       ? F::infinity_magnitude
                                                  : F::canonical_nan;
    }

    /// Expected code for a non-NaN float32 bit pattern.
    unsigned operator()(std::uint32_t bits)
    {
        const bool negative = (bits >> 31) != 0;
        const std::uint32_t magnitude = bits & 0x7fffffffu;
        if (magnitude < m_last) m_cursor = 0;
        m_last = magnitude;
        if (!F::has_zero && magnitude == 0) return F::canonical_nan;
        if (!F::is_signed && negative) return F::canonical_nan;
        unsigned code = 0;
        if (!m_away) {
            if (magnitude >= m_overflow_bits) {
                code = m_overflow_code;
            } else {
                while (m_cursor + 1 < m_values.size() && m_values[m_cursor + 1] <= magnitude) ++m_cursor;
                code = m_cursor;  // formats without zero: (0, min) -> min, like every mode
            }
        } else {
            while (m_cursor < m_values.size() && m_values[m_cursor] < magnitude) ++m_cursor;
            code = m_cursor < m_values.size() ? static_cast<unsigned>(m_cursor) : m_overflow_code;
        }
        if (F::specials == special_values::nan_negative_zero && (code == 0 || code == F::canonical_nan)) return code;
        return negative ? (code | F::sign_mask) : code;
    }

    /// The same map as runs over all 2^32 inputs, for run_cursor. The answer can only change at
    /// zero, one, a decoded value (toward zero), the float after one (away from zero) or the
    /// overflow threshold, so the oracle itself is asked once at each of those points of each sign.
    /// NaN inputs fall in their sign's last run: the oracle has no answer for them, and callers
    /// check NaN results on their own.
    [[nodiscard]] std::vector<run> runs()
    {
        std::vector<std::uint32_t> starts{0u, 1u, m_overflow_bits};
        for (const std::uint32_t value : m_values) starts.insert(starts.end(), {value, value + 1});
        std::sort(starts.begin(), starts.end());
        starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
        std::vector<run> result;
        for (const std::uint32_t sign : {0u, 0x80000000u}) {
            for (const std::uint32_t magnitude : starts) {
                if (magnitude > 0x7f800000u) break;
                const unsigned code = (*this)(sign | magnitude);
                if (result.empty() || result.back().code != code) result.push_back({sign | magnitude, code});
            }
        }
        return result;
    }

private:
    bool m_away;
    std::vector<std::uint32_t> m_values;
    std::uint32_t m_overflow_bits = 0;
    unsigned m_overflow_code = 0;
    std::size_t m_cursor = 0;
    std::uint32_t m_last = 0;
};

}  // namespace scalify::test
