#pragma once
/// \file inspect.hpp
/// ad::inspect: one step of a function run exactly as ad::value_and_grad runs it, with a report
/// of every recorded op: the output's element type, shape, scale, data RMS, amax and the shares
/// of zeros, subnormals and saturated values in its stored type, the same for the cotangent that
/// reached it in the backward sweep, and, for a matmul under a matmul_precision_scope, the casts
/// the scope made (operands to the forward format, the cotangent to the gradient format: their
/// scales, statistics and how much of each flushed to zero). Then the parameters and their
/// gradients. Printable as a table with fmt, writable as CSV (tools/inspect_scales.gp plots it).
///
///     ad::matmul_precision_scope fp8(dtype::float8_e4m3fn, dtype::float8_e5m2);
///     auto [loss, grads, report] = ad::inspect<unit_scaling>(objective, params);
///     fmt::print("{}", report);                 // the table
///     report.write_csv("step.csv");
///
/// The tape reports to the inspection through a thread-local observer (autodiff/tape.hpp):
/// each recorded op's output and inputs, and each cotangent before its rule runs, as views
/// without their C++ types. The statistics are computed here, by one function for every element
/// type; no op carries code of its own for them, and value_and_grad, which installs no observer,
/// pays one null test per op. Everything here that computes or prints is a template (the report
/// is basic_inspection<>), so a program that never inspects compiles none of it.

#include <scalify/autodiff/grad.hpp>
#include <scalify/autodiff/ops.hpp>
#include <scalify/autodiff/recipe.hpp>
#include <scalify/autodiff/tape.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/dtype.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace scalify::ad {

/// A tensor as it is stored: its element type and shape, its scale, and statistics of its data.
/// The shares are of all its elements.
struct tensor_summary {
    std::string type;                 ///< the stored element type, as ml_dtypes names it ("float32", "float8_e5m2")
    std::vector<std::size_t> shape;
    std::size_t size = 0;             ///< elements
    float scale = 0.0f;               ///< value = data x scale
    double data_rms = 0.0;            ///< RMS of the stored data (scale left out) over the finite elements
    double amax = 0.0;                ///< the largest |data x scale| over the finite elements
    double zero_fraction = 0.0;       ///< elements that are zero
    double subnormal_fraction = 0.0;  ///< non-zero elements below the type's smallest normal magnitude
    double saturated_fraction = 0.0;  ///< elements at the type's largest finite magnitude
    double non_finite_fraction = 0.0; ///< inf or NaN

    /// log2 of the scale (an integer under pow2_scale; -inf for a zero scale).
    [[nodiscard]] double log2_scale() const noexcept { return std::log2(static_cast<double>(scale)); }
};

/// A cast that a matmul_precision_scope makes inside a recorded matmul: an operand to the
/// forward format, or the cotangent reaching the product to the gradient format.
struct cast_summary {
    std::string operand;            ///< "a", "b" (the product's operands) or "cotangent"
    std::string source_type;        ///< the type cast from
    tensor_summary result;          ///< the cast's result: type is the format, scale the one it was cast at
    double flushed_fraction = 0.0;  ///< the share of the source's non-zero finite elements that became zero
};

/// One recorded op.
struct op_summary {
    std::size_t node = 0;                    ///< position on the tape (the parameters come first)
    std::string op;                          ///< the op's recorded name: "matmul", "add", "custom_op", ...
    std::vector<std::string> inputs;         ///< each input: a parameter's name, "#n" (node n) or "const"
    tensor_summary forward;                  ///< the op's output
    std::optional<tensor_summary> backward;  ///< the cotangent that reached it (none: no gradient reached it)
    std::vector<cast_summary> casts;         ///< the precision scope's casts: "a", "b", then "cotangent"

    /// The cast of `operand` ("a", "b", "cotangent"), or null.
    [[nodiscard]] const cast_summary* cast(std::string_view operand) const noexcept
    {
        for (const auto& c : casts) {
            if (c.operand == operand) return &c;
        }
        return nullptr;
    }
    /// "matmul(#7, w2)".
    [[nodiscard]] std::string label() const
    {
        std::string out = op + "(";
        for (std::size_t i = 0; i < inputs.size(); ++i) out += (i ? ", " : "") + inputs[i];
        return out + ")";
    }
};

/// A parameter leaf and its gradient.
struct parameter_summary {
    std::string name;  ///< inspect_options::parameter_names, else its position (see ad::inspect)
    std::size_t node = 0;
    tensor_summary value;
    tensor_summary gradient;
};

/// What ad::inspect saw of one step; used as ad::inspection. A class template only so that its
/// functions are compiled where they are used, not in every program that includes autodiff.hpp.
template <class Unused = void>
struct basic_inspection {
    double loss = 0.0;                          ///< the function's scalar result (data x scale)
    matmul_precision precision;                 ///< the matmul recipe in force (full_precision: none)
    std::vector<op_summary> ops;                ///< every recorded op, in recording order
    std::vector<parameter_summary> parameters;  ///< in leaf order

    /// The op recorded as node `node`; config_error when there is none.
    [[nodiscard]] const op_summary& op(std::size_t node) const
    {
        for (const auto& o : ops) {
            if (o.node == node) return o;
        }
        SCALIFY_THROW(config_error("inspection::op: no op was recorded as node " + std::to_string(node) + " (" +
                                   std::to_string(ops.size()) + " ops, " + std::to_string(parameters.size()) +
                                   " parameters)"));
        return ops.front();  // only reached if SCALIFY_THROW returns
    }
    /// The ops recorded under the name `name`, in order.
    [[nodiscard]] std::vector<const op_summary*> ops_named(std::string_view name) const
    {
        std::vector<const op_summary*> out;
        for (const auto& o : ops) {
            if (o.op == name) out.push_back(&o);
        }
        return out;
    }
    /// The parameter called `name`; config_error when there is none.
    [[nodiscard]] const parameter_summary& parameter(std::string_view name) const
    {
        for (const auto& p : parameters) {
            if (p.name == name) return p;
        }
        SCALIFY_THROW(config_error("inspection::parameter: no parameter is named '" + std::string(name) + "'"));
        return parameters.front();
    }

    /// The CSV text write_csv writes (see there).
    [[nodiscard]] std::string csv() const;

    /// One row per tensor, with a header:
    /// node,op,name,inputs,tensor,pass,type,shape,size,scale,log2_scale,data_rms,amax,zero_pct,
    /// subnormal_pct,saturated_pct,non_finite_pct,flushed_pct. tensor is value, cotangent, cast_a,
    /// cast_b, cast_cotangent (a precision scope's casts) or, for a parameter (op "parameter",
    /// named in name), value and gradient; pass is fwd or bwd; inputs are separated by spaces,
    /// shapes written 128x784; numbers in shortest round-trip form; flushed_pct only for casts.
    void write_csv(std::ostream& out) const { out << csv(); }
    /// write_csv to a file (replaced); config_error when it cannot be written.
    void write_csv(const std::string& path) const;
};

using inspection = basic_inspection<>;

/// ad::inspect's options.
struct inspect_options {
    /// Names of the parameter leaves, in leaf order (each tree in for_each_parameter's order, the
    /// trees one after another); empty: named by position (see ad::inspect).
    std::vector<std::string> parameter_names;
};

/// ad::inspect's result: value_and_grad's, and the report.
template <class Value, class Grads>
struct inspect_result {
    Value value;        ///< the function's (scalar) result, a ScaledArray
    Grads grads;        ///< one gradient tree per parameter tree (a std::tuple when there are several)
    inspection report;  ///< what ran
};

namespace detail {

/// The statistics of `a`, judged in element type `as` (the type it is stored in, or for a cast's
/// float32 result on a format's grid, that format). One function for every element type (a
/// template only to be compiled where an inspection is).
template <class Unused = void>
[[nodiscard]] tensor_summary summarize(const erased_array& a, const erased_element& as)
{
    tensor_summary s;
    s.type = std::string(as.name);
    s.shape.assign(a.shape.begin(), a.shape.end());
    s.size = a.size;
    s.scale = a.scale;
    double max_finite = 0.0, min_normal = 0.0;
    as.limits(max_finite, min_normal);
    std::size_t zeros = 0, subnormal = 0, saturated = 0, non_finite = 0, finite = 0;
    double sum_squares = 0.0, data_amax = 0.0;
    std::array<double, 512> buffer{};
    for (std::size_t first = 0; first < a.size; first += buffer.size()) {
        const std::size_t count = std::min(buffer.size(), a.size - first);
        a.type->widen(a.data, first, count, buffer.data());
        for (std::size_t i = 0; i < count; ++i) {
            const double v = buffer[i];
            if (!std::isfinite(v)) {
                ++non_finite;
                continue;
            }
            const double m = std::abs(v);
            ++finite;
            sum_squares += v * v;
            data_amax = std::max(data_amax, m);
            if (m == 0.0) ++zeros;
            else if (m < min_normal) ++subnormal;
            if (m >= max_finite) ++saturated;
        }
    }
    s.data_rms = finite ? std::sqrt(sum_squares / static_cast<double>(finite)) : 0.0;
    s.amax = data_amax * static_cast<double>(a.scale);
    if (a.size) {
        const auto n = static_cast<double>(a.size);
        s.zero_fraction = static_cast<double>(zeros) / n;
        s.subnormal_fraction = static_cast<double>(subnormal) / n;
        s.saturated_fraction = static_cast<double>(saturated) / n;
        s.non_finite_fraction = static_cast<double>(non_finite) / n;
    }
    return s;
}

template <class Unused = void>
[[nodiscard]] tensor_summary summarize(const erased_array& a)
{
    return summarize(a, *a.type);
}

/// The share of `source`'s non-zero finite elements whose counterpart in `result` (same size,
/// float32 data) is zero.
template <class Unused = void>
[[nodiscard]] double flushed_fraction(const erased_array& source, const float* result)
{
    std::size_t nonzero = 0, flushed = 0;
    std::array<double, 512> buffer{};
    for (std::size_t first = 0; first < source.size; first += buffer.size()) {
        const std::size_t count = std::min(buffer.size(), source.size - first);
        source.type->widen(source.data, first, count, buffer.data());
        for (std::size_t i = 0; i < count; ++i) {
            if (!std::isfinite(buffer[i]) || buffer[i] == 0.0) continue;
            ++nonzero;
            flushed += result[first + i] == 0.0f ? 1 : 0;
        }
    }
    return nonzero ? static_cast<double>(flushed) / static_cast<double>(nonzero) : 0.0;
}

/// The element type a dtype names.
template <class Unused = void>
[[nodiscard]] const erased_element& format_element(dtype format)
{
    return visit_dtype(format, []<class F>() -> const erased_element& { return erased_element_v<F>; });
}

/// The observer ad::inspect installs on its tape: it summarises each op's output when it is
/// recorded and each cotangent when the sweep reaches it, and recomputes the precision scope's
/// casts of a recorded matmul with the functions the matmul ran (recipe_grid), from the same
/// values, at the same scopes' settings: the same bits.
template <ScalePolicy P>
class inspection_log final : public tape_observer {
public:
    void recorded(std::size_t index, const char* op, const erased_array& output, std::span<const erased_input> inputs) override
    {
        op_summary summary;
        summary.node = index;
        summary.op = op;
        summary.forward = summarize(output);
        for (const auto& in : inputs) m_inputs_of.push_back(in.tape == this->tape ? static_cast<std::ptrdiff_t>(in.index) : -1);
        m_input_count.push_back(inputs.size());
        pending cotangent_cast;
        // A differentiable matmul under a scope is recipe_matmul: its operands cast to the forward
        // format (unless float32), the cotangent to the gradient format (unless float32), in the
        // compute type of the product. A linear casts its first two inputs so (not its bias).
        const matmul_precision precision = current_matmul_precision();
        const bool product = (std::strcmp(op, "matmul") == 0 && inputs.size() == 2) ||
                             (std::strcmp(op, "linear") == 0 && inputs.size() == 3);
        if (product && precision != full_precision) {
            if (precision.forward != dtype::float32) {
                summary.casts.push_back(cast_of("a", inputs[0].value, precision.forward, precision.scaling, inputs[0].value.type->wide));
                summary.casts.push_back(cast_of("b", inputs[1].value, precision.forward, precision.scaling, inputs[1].value.type->wide));
            }
            if (precision.gradient != dtype::float32) cotangent_cast = {true, precision.gradient, precision.scaling, output.type->wide};
        }
        if (m_position.size() <= index) m_position.resize(index + 1, -1);
        m_position[index] = static_cast<std::ptrdiff_t>(m_ops.size());
        m_ops.push_back(std::move(summary));
        m_pending.push_back(cotangent_cast);
    }

    void reached(std::size_t index, const erased_array& cotangent) override
    {
        if (index >= m_position.size() || m_position[index] < 0) return;
        const auto at = static_cast<std::size_t>(m_position[index]);
        m_ops[at].backward = summarize(cotangent);
        const pending& cast = m_pending[at];
        if (cast.active) m_ops[at].casts.push_back(cast_of("cotangent", cotangent, cast.format, cast.scaling, cast.wide));
    }

    /// The ops recorded, their inputs named: parameters (the first nodes) by `names`.
    [[nodiscard]] std::vector<op_summary> take_ops(const std::vector<std::string>& names)
    {
        std::size_t next = 0;
        for (std::size_t i = 0; i < m_ops.size(); ++i) {
            for (std::size_t k = 0; k < m_input_count[i]; ++k) {
                const std::ptrdiff_t node = m_inputs_of[next++];
                if (node < 0) m_ops[i].inputs.emplace_back("const");
                else if (static_cast<std::size_t>(node) < names.size()) m_ops[i].inputs.push_back(names[static_cast<std::size_t>(node)]);
                else m_ops[i].inputs.push_back(fmt::format("#{}", node));  // not "#" + string: GCC 12's -Wrestrict false positive at -O3
            }
        }
        return std::move(m_ops);
    }

private:
    struct pending {
        bool active = false;
        dtype format = dtype::float32;
        cast_scaling scaling = cast_scaling::propagated;
        bool wide = false;
    };

    /// `a`'s values in C (float or double) at a's scale.
    template <class C>
    [[nodiscard]] static ScaledArray<C, P> rebuilt(const erased_array& a)
    {
        xt::xarray<C> data = xt::xarray<C>::from_shape(std::vector<std::size_t>(a.shape.begin(), a.shape.end()));
        std::array<double, 512> buffer{};
        C* out = data.data();
        for (std::size_t first = 0; first < a.size; first += buffer.size()) {
            const std::size_t count = std::min(buffer.size(), a.size - first);
            a.type->widen(a.data, first, count, buffer.data());
            for (std::size_t i = 0; i < count; ++i) out[first + i] = static_cast<C>(buffer[i]);
        }
        return ScaledArray<C, P>(std::move(data), a.scale);
    }

    /// The cast recipe_matmul makes of `source` (held in float, or double where `wide`).
    [[nodiscard]] static cast_summary cast_of(const char* operand, const erased_array& source, dtype format, cast_scaling scaling,
                                              bool wide)
    {
        const ScaledArray<float, P> grid = wide ? recipe_grid(rebuilt<double>(source), format, scaling)
                                                : recipe_grid(rebuilt<float>(source), format, scaling);
        cast_summary c;
        c.operand = operand;
        c.source_type = std::string(source.type->name);
        c.result = summarize(erase(grid), format_element(format));
        c.flushed_fraction = flushed_fraction(source, grid.data().data());
        return c;
    }

    std::vector<op_summary> m_ops;
    std::vector<pending> m_pending;                 ///< per op: the cotangent cast to recompute
    std::vector<std::ptrdiff_t> m_position;         ///< node -> index in m_ops (-1: not an op)
    std::vector<std::ptrdiff_t> m_inputs_of;        ///< the ops' input nodes, one op after the other (-1: a constant)
    std::vector<std::size_t> m_input_count;
};

template <class Unused = void>
[[nodiscard]] std::string leaf_path(const std::string& path, const std::string& step)
{
    return path.empty() ? step : path + "." + step;
}

/// f(path, leaf) for every leaf of a parameter (or gradient) tree, in leaf order; a path is the
/// leaf's positions (struct fields, vector and array entries) and keys (maps) joined by '.'.
template <class Tree, class F>
void for_each_leaf_path(const Tree& tree, const std::string& path, F& f)
{
    if constexpr (is_tree_leaf_v<Tree>) {
        f(path, tree);
    } else if constexpr (is_std_vector_v<Tree> || is_std_array_v<Tree>) {
        for (std::size_t i = 0; i < tree.size(); ++i) for_each_leaf_path(tree[i], leaf_path(path, std::to_string(i)), f);
    } else if constexpr (is_string_map_v<Tree>) {
        for (const auto& [key, item] : tree) for_each_leaf_path(item, leaf_path(path, key), f);
    } else {
        std::size_t i = 0;
        for_each_parameter(const_cast<Tree&>(tree), [&](auto& field) {  // the hook takes Self&; nothing is written
            for_each_leaf_path(std::as_const(field), leaf_path(path, std::to_string(i++)), f);
        });
    }
}

/// The summary of a parameter (a ScaledArray) or a gradient.
template <class Leaf>
[[nodiscard]] tensor_summary summarize_leaf(const Leaf& leaf)
{
    if constexpr (is_gradient_v<Leaf>) {
        return leaf.visit([](const auto& held) { return summarize(erase(held)); });
    } else {
        return summarize(erase(leaf));
    }
}

/// Every leaf of the trees, as (name, summary), in leaf order: one tree is named from its
/// leaves' paths, several from their position first; a lone leaf is "param".
template <class... Trees>
[[nodiscard]] std::vector<std::pair<std::string, tensor_summary>> summarize_trees(const Trees&... trees)
{
    std::vector<std::pair<std::string, tensor_summary>> out;
    auto add = [&](const std::string& path, const auto& leaf) {
        out.emplace_back(path.empty() ? std::string("param") : path, summarize_leaf(leaf));
    };
    std::size_t tree_index = 0;
    const auto walk = [&](const auto& tree) {
        for_each_leaf_path(tree, sizeof...(Trees) == 1 ? std::string() : std::to_string(tree_index), add);
        ++tree_index;
    };
    (walk(trees), ...);
    return out;
}

template <class Strategy, class F, class... Params>
[[nodiscard]] auto checked_inspect(const inspect_options& options, F&& f, const Params&... params)
{
    static_assert(sizeof...(Params) > 0, "inspect: give at least one parameter tree");
    using P = params_policy_t<Params...>;

    inspection report;
    auto values = summarize_trees(params...);
    std::vector<std::string> names;
    if (!options.parameter_names.empty()) {
        if (options.parameter_names.size() != values.size()) {
            SCALIFY_THROW(config_error(fmt::format("ad::inspect: {} parameter names for {} parameter leaves",
                                                   options.parameter_names.size(), values.size())));
        }
        names = options.parameter_names;
    } else {
        for (const auto& v : values) names.push_back(v.first);
    }
    report.precision = current_matmul_precision();

    inspection_log<P> log;
    auto result = checked_value_and_grad<Strategy>(&log, std::forward<F>(f), params...);
    report.ops = log.take_ops(names);
    const erased_array loss = erase(result.value);
    double first_element = 0.0;
    loss.type->widen(loss.data, 0, 1, &first_element);
    report.loss = first_element * static_cast<double>(loss.scale);

    std::vector<std::pair<std::string, tensor_summary>> gradients;
    if constexpr (sizeof...(Params) == 1) {
        gradients = summarize_trees(result.grads);
    } else {
        gradients = std::apply([](const auto&... trees) { return summarize_trees(trees...); }, result.grads);
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
        report.parameters.push_back({names[i], i, std::move(values[i].second), std::move(gradients[i].second)});
    }
    return inspect_result<decltype(result.value), decltype(result.grads)>{std::move(result.value), std::move(result.grads),
                                                                          std::move(report)};
}

/// "128x784" ("scalar" for a 0-d shape).
template <class Shape>
[[nodiscard]] std::string shape_text(const Shape& shape)
{
    return shape.empty() ? std::string("scalar") : scalify::detail::joined(shape, "x");
}

}  // namespace detail

template <class Unused>
std::string basic_inspection<Unused>::csv() const
{
    std::string text =
        "node,op,name,inputs,tensor,pass,type,shape,size,scale,log2_scale,data_rms,amax,zero_pct,subnormal_pct,saturated_pct,"
        "non_finite_pct,flushed_pct\n";
    // Numbers in fmt's shortest round-trip form. fmt::format, not format_to, throughout: format_to
    // compiles fmt's formatting engine into every program that uses it (fmt 9 declares it for no
    // type extern; 2.3 CPU-s and 83 KB of code with g++ 12 -O2), format runs libfmt's.
    const auto row = [&](std::size_t node, std::string_view op, std::string_view name, std::string_view inputs,
                         std::string_view tensor, std::string_view pass, const tensor_summary& s, const double* flushed) {
        text += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},", node, op, name, inputs, tensor, pass, s.type,
                            detail::shape_text(s.shape), s.size, s.scale, s.log2_scale(), s.data_rms, s.amax,
                            100 * s.zero_fraction, 100 * s.subnormal_fraction, 100 * s.saturated_fraction,
                            100 * s.non_finite_fraction);
        if (flushed != nullptr) text += fmt::format("{}", 100 * *flushed);
        text += '\n';
    };
    for (const auto& p : parameters) {
        row(p.node, "parameter", p.name, "", "value", "fwd", p.value, nullptr);
        row(p.node, "parameter", p.name, "", "gradient", "bwd", p.gradient, nullptr);
    }
    for (const auto& o : ops) {
        std::string inputs;
        for (const auto& in : o.inputs) inputs += (inputs.empty() ? "" : " ") + in;
        row(o.node, o.op, "", inputs, "value", "fwd", o.forward, nullptr);
        for (const auto& c : o.casts) {
            if (c.operand != "cotangent") row(o.node, o.op, "", inputs, "cast_" + c.operand, "fwd", c.result, &c.flushed_fraction);
        }
        if (o.backward) row(o.node, o.op, "", inputs, "cotangent", "bwd", *o.backward, nullptr);
        if (const cast_summary* c = o.cast("cotangent")) row(o.node, o.op, "", inputs, "cast_cotangent", "bwd", c->result, &c->flushed_fraction);
    }
    return text;
}

template <class Unused>
void basic_inspection<Unused>::write_csv(const std::string& path) const
{
    const std::string text = csv();
    std::FILE* file = std::fopen(path.c_str(), "wb");
    int failure = errno;
    bool written = false;
    if (file != nullptr) {
        written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
        if (!written) failure = errno;
        if (std::fclose(file) != 0 && written) {
            failure = errno;
            written = false;
        }
    }
    if (!written) {
        SCALIFY_THROW(config_error(fmt::format("inspection::write_csv: cannot write '{}': {}", path, std::strerror(failure))));
    }
}

/// One step of f on the parameters, run exactly as value_and_grad<Strategy>(f, params...) runs it
/// (same tape, same ops, same scales: the value and the gradients are the same bits), and what
/// ran: returns {value, grads, report} (ad::inspection). The report lists every op recorded on
/// the step's tape, in order (values that depend on no parameter are constants, not recorded),
/// with its output, the cotangent that reached it and the casts of the matmul_precision_scope in
/// force; then every parameter leaf and its gradient, named by options.parameter_names or by
/// position: the leaf's struct field, vector or array index and map key, joined by '.', preceded
/// by the tree's position when there are several trees ("0.3", "1.0.11"); a lone leaf is
/// "param". config_error when the names do not match the leaves in number; otherwise
/// value_and_grad's errors. A matmul under `cast_scaling::current` measures its amax once more
/// for the report (under several ranks, every rank must inspect).
template <class Strategy = default_scaling, class F, class... Params>
[[nodiscard]] auto inspect(const inspect_options& options, F&& f, const Params&... params)
{
    if constexpr (detail::checked_strategy<Strategy>() && detail::checked_parameters<Params...>()) {
        return detail::checked_inspect<Strategy>(options, std::forward<F>(f), params...);
    } else {
        return inspect_result<int, int>{};  // never used: a static_assert above has failed
    }
}

/// inspect with the parameters named by position.
template <class Strategy = default_scaling, class F, class... Params>
    requires(!std::same_as<std::remove_cvref_t<F>, inspect_options>)
[[nodiscard]] auto inspect(F&& f, const Params&... params)
{
    return inspect<Strategy>(inspect_options{}, std::forward<F>(f), params...);
}

}  // namespace scalify::ad

/// The report as an aligned table: a header line (loss, the matmul recipe), then per op a row of
/// its output ("value"), the casts of its operands, the cotangent that reached it and its cast;
/// then per parameter its value and its gradient. Scales that are powers of two print as 2^k;
/// shares print in percent ("0" for none, "<0.01" below a hundredth of a percent).
template <>
struct fmt::formatter<scalify::ad::basic_inspection<void>> {
    constexpr auto parse(format_parse_context& ctx) { return ctx.begin(); }
    // The return type named: fmt instantiates a deduced one's body wherever the header is read.
    template <class Context>
    typename Context::iterator format(const scalify::ad::basic_inspection<void>& r, Context& ctx) const
    {
        using scalify::ad::cast_summary;
        using scalify::ad::tensor_summary;
        const auto scale_text = [](float scale) -> std::string {
            int exponent = 0;
            if (scale > 0.0f && std::isfinite(scale) && std::frexp(scale, &exponent) == 0.5f) return fmt::format("2^{}", exponent - 1);
            return fmt::format("{:.4g}", scale);
        };
        const auto percent = [](double fraction) -> std::string {
            if (fraction == 0.0) return "0";
            if (100 * fraction < 0.01) return "<0.01";
            return fmt::format("{:.2f}", 100 * fraction);
        };
        const auto scaling_name = [](scalify::ad::cast_scaling s) {
            return s == scalify::ad::cast_scaling::propagated ? "propagated" : s == scalify::ad::cast_scaling::current ? "current" : "unscaled";
        };
        std::size_t width = 9;
        for (const auto& o : r.ops) width = std::max(width, o.label().size() + 1 + std::to_string(o.node).size() + 1);
        for (const auto& p : r.parameters) width = std::max(width, p.name.size());
        std::string text;  // fmt::format, not format_to: see basic_inspection::csv
        if (r.precision == scalify::ad::full_precision) {
            text += fmt::format("loss {:.6g}; {} ops, {} parameters; no matmul_precision_scope\n", r.loss, r.ops.size(),
                                r.parameters.size());
        } else {
            text += fmt::format("loss {:.6g}; {} ops, {} parameters; matmul_precision_scope: operands {}, cotangents {}, {} scaling\n",
                                r.loss, r.ops.size(), r.parameters.size(), to_string(r.precision.forward),
                                to_string(r.precision.gradient), scaling_name(r.precision.scaling));
        }
        const auto row = [&](std::string_view first, std::string_view tensor, const tensor_summary& s, const cast_summary* cast) {
            text += fmt::format("{:<{}}  {:<14}  {:<13}  {:<11}  {:>7}  {:>9.4g}  {:>9.4g}  {:>6}  {:>6}  {:>6}  {:>6}\n", first,
                                width, tensor, s.type, scalify::ad::detail::shape_text(s.shape), scale_text(s.scale), s.data_rms,
                                s.amax, percent(s.zero_fraction), percent(s.subnormal_fraction), percent(s.saturated_fraction),
                                cast != nullptr ? percent(cast->flushed_fraction) : std::string("-"));
            if (s.non_finite_fraction > 0.0) text += fmt::format("{:<{}}  {} non-finite\n", "", width, percent(s.non_finite_fraction) + " %");
        };
        text += fmt::format("{:<{}}  {:<14}  {:<13}  {:<11}  {:>7}  {:>9}  {:>9}  {:>6}  {:>6}  {:>6}  {:>6}\n", "#node op", width,
                            "tensor", "type", "shape", "scale", "data rms", "amax", "zero%", "subn%", "sat%", "flush%");
        for (const auto& o : r.ops) {
            row(fmt::format("#{} {}", o.node, o.label()), "value", o.forward, nullptr);
            for (const auto& c : o.casts) {
                if (c.operand != "cotangent") row("", "cast " + c.operand, c.result, &c);
            }
            if (o.backward) row("", "cotangent", *o.backward, nullptr);
            if (const cast_summary* c = o.cast("cotangent")) row("", "cast cotangent", c->result, c);
        }
        text += fmt::format("{:<{}}  {:<14}\n", "parameter", width, "tensor");
        for (const auto& p : r.parameters) {
            row(p.name, "value", p.value, nullptr);
            row("", "gradient", p.gradient, nullptr);
        }
        return std::copy(text.begin(), text.end(), ctx.out());
    }
};
