// libFuzzer target: random graphs through the autodiff layer. Fuzzer bytes choose the element
// type, scale policy, strategy, shapes, scales (2^-40 .. 2^40, or 0), data and a chain of ops;
// the tape's gradients must equal the hand-composed backward rules bit for bit, and misuse
// (an escaped var, a non-scalar output) must end in the typed errors, never UB. ad::inspect of
// the same chain, under a drawn matmul recipe, must give value_and_grad's value and gradients
// bit for bit, with a report whose statistics are in range and that prints and writes as CSV.
#include "../support/random_chain.hpp"
#include "fuzz_support.hpp"

#include <scalify/scalify.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <sstream>

namespace fuzz_autodiff {

using namespace scalify;
using scalify::testing::chain;
using scalify::testing::chain_op;

namespace {

template <class T, class P>
ScaledArray<T, P> read_array(fuzz::reader& in, std::vector<std::size_t> shape)
{
    xt::xarray<T> data = xt::xarray<T>::from_shape(shape);
    for (auto& x : data) x = static_cast<T>(static_cast<float>(static_cast<std::int8_t>(in.byte())) / 32.0f);
    const int exponent = static_cast<int>(in.byte() % 82) - 41;  // -41: a zero scale
    return ScaledArray<T, P>(std::move(data), exponent == -41 ? 0.0f : std::ldexp(1.0f, exponent));
}

template <class P>
bool same_gradient(const ad::gradient<P>& x, const ad::gradient<P>& y)
{
    if (x.type_name() != y.type_name() || x.scale() != y.scale() || x.shape() != y.shape()) return false;
    return x.visit([&](const auto& a) {
        using A = std::remove_cvref_t<decltype(a)>;
        const auto& b = std::get<A>(y.variant());
        return std::memcmp(a.data().data(), b.data().data(), a.size() * sizeof(typename A::value_type)) == 0;
    });
}

/// gradient::visit_widened hands over the values the held type has, under the same scale.
template <class P>
bool widened_as_held(const ad::gradient<P>& g)
{
    return g.visit_widened([&](const auto& wide) {
        return g.visit([&](const auto& held) {
            if (wide.scale() != held.scale() || wide.size() != held.size()) return false;
            for (std::size_t i = 0; i < held.size(); ++i) {
                const double a = double(scalify::detail::load(wide.data().data()[i]));
                const double b = double(scalify::detail::load(held.data().data()[i]));
                if (!(a == b || (a != a && b != b))) return false;
            }
            return true;
        });
    });
}

bool in_range(const ad::tensor_summary& s)
{
    std::size_t size = 1;
    for (const std::size_t n : s.shape) size *= n;
    const double shares[] = {s.zero_fraction, s.subnormal_fraction, s.saturated_fraction, s.non_finite_fraction};
    for (const double x : shares) {
        if (!(x >= 0.0 && x <= 1.0)) return false;
    }
    return size == s.size && s.zero_fraction + s.subnormal_fraction + s.non_finite_fraction <= 1.0 + 1e-12 && s.amax >= 0.0 &&
           s.data_rms >= 0.0;
}

/// ad::inspect of the chain under a drawn recipe against value_and_grad under the same recipe.
template <class Strategy, class T, class P>
void check_inspect(fuzz::reader& in, const chain& program, const std::array<ScaledArray<T, P>, 4>& params)
{
    const ad::matmul_precision recipes[] = {ad::full_precision,
                                            {dtype::float8_e4m3fn, dtype::float8_e5m2, ad::cast_scaling::propagated},
                                            {dtype::float8_e4m3fn, dtype::float8_e5m2, ad::cast_scaling::current},
                                            {dtype::float32, dtype::float8_e5m2, ad::cast_scaling::unscaled}};
    const ad::matmul_precision recipe = recipes[in.byte() % 4];
    const ad::matmul_precision_scope scope(recipe);
    const auto f = [&](const auto& ps) { return program(ps[0], ps[1], ps[2], ps[3]); };
    using result = decltype(ad::value_and_grad<Strategy>(f, params));
    std::optional<result> reference;
    try {
        reference.emplace(ad::value_and_grad<Strategy>(f, params));
    } catch (const scale_error&) {
    }
    try {
        const auto inspected = ad::inspect<Strategy>(f, params);
        if (!reference) fuzz::fail("inspect completed where value_and_grad threw a scale_error");
        if (inspected.value.scale() != reference->value.scale() ||
            std::memcmp(inspected.value.data().data(), reference->value.data().data(), sizeof(T)) != 0) {
            fuzz::fail("inspect's value differs from value_and_grad's");
        }
        const ad::inspection& report = inspected.report;
        if (report.parameters.size() != 4 || report.ops.empty() || report.precision != recipe) fuzz::fail("inspect: wrong report size");
        for (std::size_t i = 0; i < 4; ++i) {
            if (!same_gradient(inspected.grads[i], reference->grads[i])) fuzz::fail("inspect's gradient differs from value_and_grad's");
            if (!reference->grads[i].empty() && !widened_as_held(reference->grads[i])) {
                fuzz::fail("gradient::visit_widened reads other values than the held type's");
            }
            const ad::parameter_summary& p = report.parameters[i];
            if (p.node != i || p.gradient.type != inspected.grads[i].type_name() || p.gradient.scale != inspected.grads[i].scale() ||
                p.value.scale != params[i].scale() || !in_range(p.value) || !in_range(p.gradient)) {
                fuzz::fail("inspect: a parameter's summary does not match it");
            }
        }
        for (const auto& op : report.ops) {
            if (!in_range(op.forward) || (op.backward && !in_range(*op.backward))) fuzz::fail("inspect: statistics out of range");
            const bool recipe_matmul = op.op == "matmul" && recipe != ad::full_precision;
            const std::size_t operand_casts = recipe_matmul && recipe.forward != dtype::float32 ? 2 : 0;
            const std::size_t cotangent_casts = recipe_matmul && op.backward ? 1 : 0;
            if (op.casts.size() != operand_casts + cotangent_casts) fuzz::fail("inspect: a matmul's casts are missing");
            for (const auto& c : op.casts) {
                const dtype format = c.operand == "cotangent" ? recipe.gradient : recipe.forward;
                if (c.result.type != to_string(format) || !in_range(c.result) || !(c.flushed_fraction >= 0.0 && c.flushed_fraction <= 1.0)) {
                    fuzz::fail("inspect: a cast's summary is out of range");
                }
            }
        }
        std::ostringstream csv;
        report.write_csv(csv);
        if (fmt::format("{}", report).empty() || csv.str().empty()) fuzz::fail("inspect: the report did not print");
    } catch (const scale_error&) {
        if (reference) fuzz::fail("inspect threw a scale_error where value_and_grad did not");
    }
}

template <class Strategy, class T, class P>
void run(fuzz::reader& in)
{
    const std::size_t m = 1 + in.byte() % 6, k = 1 + in.byte() % 9, n = 1 + in.byte() % 6;
    chain program;
    const std::size_t length = in.byte() % 7;
    for (std::size_t i = 0; i < length; ++i) program.ops.push_back(static_cast<chain_op>(in.byte() % testing::chain_op_count));
    program.ops.push_back(chain_op::mul_c);
    program.ops.push_back(chain_op::add_bias);
    const auto a = read_array<T, P>(in, {m, k});
    const auto b = read_array<T, P>(in, {k, n});
    const auto c = read_array<T, P>(in, {m, n});
    const auto bias = read_array<T, P>(in, {n});

    ad::tape<P> tape;
    // Half the parameters read in place (value_and_grad's way), half copied.
    const auto va = tape.template watch_in_place<Strategy>(a);
    const auto vb = tape.template watch<Strategy>(b);
    const auto vc = tape.template watch_in_place<Strategy>(c);
    const auto vbias = tape.template watch<Strategy>(bias);
    try {
        const auto out = program(va, vb, vc, vbias);
        tape.backward(out);
    } catch (const scale_error&) {
        return;  // a scale rule overflowed float32: the documented error, from the forward or backward ops
    }
    const auto hand = testing::hand_gradients<Strategy>(program, a, b, c, bias);
    if (!testing::same_bits(tape.gradient_of(va), hand.a) || !testing::same_bits(tape.gradient_of(vb), hand.b) ||
        !testing::same_bits(tape.gradient_of(vc), hand.c) || !testing::same_bits(tape.gradient_of(vbias), hand.bias)) {
        fuzz::fail("autodiff gradient differs from the hand-composed backward rules");
    }
    check_inspect<Strategy>(in, program, std::array{a, b, c, bias});

    // take_gradient moves the same gradient out, and the tape then holds none.
    if (!testing::same_bits(tape.take_gradient(va), hand.a)) fuzz::fail("take_gradient differs from gradient_of");
    try {
        (void)tape.gradient_of(va);
        fuzz::fail("gradient_of after take_gradient did not throw");
    } catch (const autodiff_error&) {
    }

    // Misuse: a non-scalar output (a one-element output is a scalar), an escaped var.
    if (vc.size() > 1) {
        try {
            tape.backward(vc * 2.0);
            fuzz::fail("backward of a non-scalar output without a seed did not throw");
        } catch (const autodiff_error&) {
        }
    }
    ad::var<T, P, Strategy> escaped;
    {
        ad::tape<P> inner;
        escaped = inner.template watch<Strategy>(a) * 2.0;
    }
    try {
        (void)(escaped + va);
        fuzz::fail("a var of a destroyed tape entered an op");
    } catch (const autodiff_error&) {
    }
    // A parameter read in place that outlives its tape holds a copy of the same bytes.
    ad::var<T, P, Strategy> escaped_parameter;
    {
        ad::tape<P> inner;
        escaped_parameter = inner.template watch_in_place<Strategy>(b);
        if (escaped_parameter.value().data().data() != b.data().data()) fuzz::fail("watch_in_place copied");
    }
    const auto& kept = escaped_parameter.value();
    if (kept.data().data() == b.data().data() || kept.scale() != b.scale() ||
        std::memcmp(kept.data().data(), b.data().data(), b.size() * sizeof(T)) != 0) {
        fuzz::fail("a parameter var that outlived its tape does not hold its own copy");
    }
}

}  // namespace

/// The target's body; fuzz_autodiff's LLVMFuzzerTestOneInput (generated) calls it.
int test_one_input(const std::uint8_t* data, std::size_t size)
{
    fuzz::reader in{data, size};
    // Two (strategy, type, policy) combinations: float32 under default_scaling with float scales,
    // and e4m3fn under unit_scaling with power-of-two scales (mixed float / e4m3fn cotangents).
    // Every op's backward rule is instantiated for all six gradient types either way; more
    // combinations only make the sanitizer build slower (the unit tests cover half, bfloat16 and
    // double).
    if (in.byte() % 2) run<unit_scaling, float8_e4m3fn, pow2_scale>(in);
    else run<default_scaling, float, float_scale>(in);
    return 0;
}

}  // namespace fuzz_autodiff
