#pragma once
/// \file diagnostics.hpp
/// Over/underflow diagnostics without a high-precision baseline:
/// - tensor_stats<Target>(a): how a ScaledArray's values would fare stored in Target (amax,
///   smallest non-zero magnitude, share that would saturate / overflow, share that would flush to
///   zero, share landing in Target's subnormals, a histogram of binary exponents), printable with fmt;
/// - scale_tracker: per-op scales and data amax over steps, written as CSV.
///
///     fmt::print("{}\n", tensor_stats<float8_e4m3fn>(grad, "fc1.grad"));   // or (grad, dtype, "fc1.grad")
///     // fc1.grad: 4096 elements as float8_e4m3fn: amax 3.1, ..., flush to zero 0.12%, ...
///     tracker.record(step, "fc1.matmul", y);  ...  tracker.write_csv(file);

#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/dtype.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/scaled_array.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace scalify {

struct tensor_stats_result {
    std::string name;                   ///< the tensor's name, as the caller gave it ("" if none)
    std::string target;                 ///< the format judged against (element_name<Target>)
    std::size_t count = 0;              ///< elements
    std::size_t zeros = 0;              ///< exact zeros in the value
    std::size_t non_finite = 0;         ///< inf or NaN already in the value
    double amax = 0;                    ///< max |value| over finite elements
    double min_nonzero = 0;             ///< smallest non-zero |value| (0 if none)
    double saturate_fraction = 0;       ///< share of elements with |value| > max(Target)
    double underflow_fraction = 0;      ///< share of non-zero elements that round to zero in Target
    double subnormal_fraction = 0;      ///< share of non-zero elements in Target's subnormal range
    std::map<int, std::size_t> exponent_histogram;  ///< floor(log2 |value|) -> count, non-zero finite elements
};

/// What tensor_stats judges values against: a format's name and range.
struct format_range {
    std::string_view name;    ///< element_name of the format
    double max = 0;           ///< the largest finite value
    double min_normal = 0;    ///< the smallest normal
    double zero_threshold = 0;  ///< the largest magnitude that rounds to zero: half the smallest subnormal (ties to even)
};

template <ScaledElement Target>
[[nodiscard]] format_range format_range_of() noexcept
{
    return {element_name<Target>, static_cast<double>(static_cast<float>(std::numeric_limits<Target>::max())),
            static_cast<double>(static_cast<float>(std::numeric_limits<Target>::min())),
            static_cast<double>(static_cast<float>(std::numeric_limits<Target>::denorm_min())) / 2};
}

/// The range of the format a dtype names.
[[nodiscard]] inline format_range format_range_of(dtype type)
{
    return visit_dtype(type, []<class F>() { return format_range_of<F>(); });
}

namespace detail {
/// tensor_stats against `target`: one compiled loop per array type, whatever the target format.
template <class T, class P>
[[nodiscard]] tensor_stats_result tensor_stats_in(const ScaledArray<T, P>& a, const format_range& target, std::string name)
{
    const double max = target.max;
    const double min_normal = target.min_normal;
    const double zero_threshold = target.zero_threshold;
    tensor_stats_result r;
    r.name = std::move(name);
    r.target = std::string(target.name);
    r.count = a.size();
    std::size_t saturating = 0, underflowing = 0, subnormal = 0, nonzero = 0;
    double smallest = std::numeric_limits<double>::infinity();
    for (const auto& x : a.data()) {
        const double v = a.scale() == 0.0f ? 0.0 : static_cast<double>(detail::load(x)) * a.scale();
        const double m = std::abs(v);
        if (!std::isfinite(v)) {
            ++r.non_finite;
            continue;
        }
        if (m == 0.0) {
            ++r.zeros;
            continue;
        }
        ++nonzero;
        r.amax = std::max(r.amax, m);
        smallest = std::min(smallest, m);
        saturating += m > max ? 1 : 0;
        underflowing += m <= zero_threshold ? 1 : 0;
        subnormal += (m > zero_threshold && m < min_normal) ? 1 : 0;
        ++r.exponent_histogram[std::ilogb(m)];
    }
    r.min_nonzero = nonzero ? smallest : 0.0;
    if (r.count) r.saturate_fraction = static_cast<double>(saturating) / static_cast<double>(r.count);
    if (nonzero) {
        r.underflow_fraction = static_cast<double>(underflowing) / static_cast<double>(nonzero);
        r.subnormal_fraction = static_cast<double>(subnormal) / static_cast<double>(nonzero);
    }
    return r;
}
}  // namespace detail

/// The statistics of a.value() (computed in double) judged against Target's range; `name` names
/// the tensor in the printed line.
template <ScaledElement Target, class T, class P>
[[nodiscard]] tensor_stats_result tensor_stats(const ScaledArray<T, P>& a, std::string name = {})
{
    return detail::tensor_stats_in(a, format_range_of<Target>(), std::move(name));
}

/// The same against a format chosen at run time (float32, f16, bf16, e4m3fn, e5m2): the result of
/// tensor_stats<T>(a, name) for the type T that `target` names.
template <class T, class P>
[[nodiscard]] tensor_stats_result tensor_stats(const ScaledArray<T, P>& a, dtype target, std::string name = {})
{
    return detail::tensor_stats_in(a, format_range_of(target), std::move(name));
}

/// Records (step, op, scale, data amax) rows; write_csv emits them with a header.
class scale_tracker {
public:
    struct row {
        std::size_t step;
        std::string op;
        float scale;
        float data_amax;
    };

    template <class T, class P>
    void record(std::size_t step, std::string op, const ScaledArray<T, P>& a)
    {
        float amax = 0.0f;
        for (const auto& x : a.data()) {
            const float m = std::abs(static_cast<float>(detail::load(x)));
            amax = m > amax ? m : amax;
        }
        m_rows.push_back({step, std::move(op), a.scale(), amax});
    }

    [[nodiscard]] const std::vector<row>& rows() const noexcept { return m_rows; }

    /// "step,op,scale,data_amax" then one line per record; floats printed exactly (shortest round trip).
    void write_csv(std::ostream& out) const
    {
        out << "step,op,scale,data_amax\n";
        for (const auto& r : m_rows) out << fmt::format("{},{},{},{}\n", r.step, r.op, r.scale, r.data_amax);
    }

private:
    std::vector<row> m_rows;
};

}  // namespace scalify

template <>
struct fmt::formatter<scalify::tensor_stats_result> {
    constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
    // The return type named: fmt instantiates a deduced one's body wherever the header is read.
    template <class Context>
    typename Context::iterator format(const scalify::tensor_stats_result& s, Context& ctx) const
    {
        // fmt::format, not format_to: format_to compiles fmt's formatting engine into every program
        // that prints this (fmt 9 declares it for no type extern), format runs libfmt's.
        std::string text;
        if (!s.name.empty()) text += s.name + ": ";
        text += fmt::format("{} elements as {}: amax {:.4g}, min non-zero {:.4g}, zeros {}, non-finite {}, "
                            "saturate {:.2f}%, flush to zero {:.2f}%, subnormal {:.2f}%; exponents",
                            s.count, s.target, s.amax, s.min_nonzero, s.zeros, s.non_finite, 100 * s.saturate_fraction,
                            100 * s.underflow_fraction, 100 * s.subnormal_fraction);
        for (const auto& [exponent, count] : s.exponent_histogram) text += fmt::format(" 2^{}:{}", exponent, count);
        return std::copy(text.begin(), text.end(), ctx.out());
    }
};
