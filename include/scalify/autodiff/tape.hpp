#pragma once
/// \file tape.hpp
/// Reverse-mode autodiff over ScaledArrays: ad::var (a differentiable value), ad::tape (the
/// Wengert list it records into) and ad::custom_op (how an op records itself).
///
/// A var holds a ScaledArray<T, P> and, when it depends on a watched parameter, a node on a tape.
/// Every differentiable op computes its result eagerly with the scaled primitives (so scales
/// propagate exactly as without autodiff) and, when an input needs a gradient, appends a node
/// whose backward function maps the output's cotangent to its inputs' cotangents with the
/// backward rules that sit beside each op (ops/*.hpp). tape::backward walks the nodes in reverse.
///
/// Lifetime: the tape owns its nodes; a node keeps its value (needed by its consumers' backward
/// rules) and shares its inputs' nodes. Destroying the tape frees the whole graph; a var that
/// outlived it still reads its value but cannot enter a new op (autodiff_error).
///
///     ad::tape<pow2_scale> tape;
///     auto w = tape.watch<unit_scaling>(w0);         // a parameter
///     auto loss = reduce_sum(relu(matmul(x, w)));     // x: a ScaledArray, a constant here
///     tape.backward(loss);
///     ad::gradient<pow2_scale> gw = tape.gradient(w);

#include <scalify/autodiff/gradient.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/dtype.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/scaling.hpp>

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace scalify::ad {

/// Returned by a backward function for an input that gets no gradient (a mask, an index).
struct no_gradient {};

template <ScaledElement T, ScalePolicy P = float_scale, class Strategy = default_scaling>
class var;

template <ScalePolicy P>
class tape;

namespace detail {

// ---- what an inspection sees (autodiff/inspect.hpp) ------------------------------------------

/// An element type without its C++ type, as an inspection reads it (one constant per element
/// type; dist::all_reduce_gradients encodes gradients through it too).
struct erased_element {
    std::string_view name;  ///< element_name<T>
    bool wide = false;      ///< computes in double (T is double); else in float
    /// out[i] = data[first + i] as a double (exact), for i < count.
    void (*widen)(const void* data, std::size_t first, std::size_t count, double* out) = nullptr;
    /// The largest finite magnitude and the smallest positive normal one.
    void (*limits)(double& max_finite, double& min_normal) = nullptr;
};

template <ScaledElement T>
void widen_elements(const void* data, std::size_t first, std::size_t count, double* out) noexcept
{
    const T* in = static_cast<const T*>(data) + first;
    for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<double>(scalify::detail::load(in[i]));
}

template <ScaledElement T>
void element_limits(double& max_finite, double& min_normal) noexcept
{
    max_finite = static_cast<double>(static_cast<compute_t<T>>(std::numeric_limits<T>::max()));
    min_normal = static_cast<double>(static_cast<compute_t<T>>(std::numeric_limits<T>::min()));
}

template <ScaledElement T>
inline constexpr erased_element erased_element_v{element_name<T>, std::same_as<T, double>, &widen_elements<T>, &element_limits<T>};

/// A value or a cotangent without its element type: its data are read in place.
struct erased_array {
    const erased_element* type = nullptr;
    const void* data = nullptr;
    std::span<const std::size_t> shape;
    std::size_t size = 0;
    float scale = 0;
};

template <ScaledElement T, ScalePolicy P>
[[nodiscard]] erased_array erase(const ScaledArray<T, P>& a)
{
    return {&erased_element_v<T>, a.data().data(), std::span<const std::size_t>(a.shape().data(), a.shape().size()),
            a.size(), a.scale()};
}

/// An op's input as an observer sees it: its value and where it was recorded.
struct erased_input {
    erased_array value;
    const void* tape = nullptr;  ///< the tape it is a node of; null for a constant
    std::size_t index = 0;       ///< its position on that tape
};

/// A node's backward rule, a move-only callable void(gradient<P>&&): the closure on the heap and
/// two functions of its own (call, destroy). std::function compiled a manager, an invoker and an
/// RTTI name for every op's closure (34 KB of char_lm.cpp's 1 MB of object code).
template <ScalePolicy P>
class backward_rule {
public:
    backward_rule() = default;
    backward_rule(std::nullptr_t) noexcept {}  // NOLINT: implicit, as std::function's
    template <class F>
        requires(!std::same_as<std::remove_cvref_t<F>, backward_rule> && !std::same_as<std::remove_cvref_t<F>, std::nullptr_t>)
    backward_rule(F&& f)  // NOLINT: implicit, as std::function's
        : m_closure(new std::remove_cvref_t<F>(std::forward<F>(f))), m_call(&call<std::remove_cvref_t<F>>),
          m_destroy(&destroy<std::remove_cvref_t<F>>)
    {
    }
    backward_rule(backward_rule&& other) noexcept { swap(other); }
    backward_rule& operator=(backward_rule&& other) noexcept
    {
        backward_rule(std::move(other)).swap(*this);
        return *this;
    }
    backward_rule(const backward_rule&) = delete;
    backward_rule& operator=(const backward_rule&) = delete;
    ~backward_rule()
    {
        if (m_closure != nullptr) m_destroy(m_closure);
    }

    explicit operator bool() const noexcept { return m_closure != nullptr; }
    void operator()(gradient<P>&& g) const { m_call(m_closure, std::move(g)); }

private:
    template <class F>
    static void call(void* closure, gradient<P>&& g)
    {
        (*static_cast<F*>(closure))(std::move(g));
    }
    template <class F>
    static void destroy(void* closure) noexcept
    {
        delete static_cast<F*>(closure);
    }
    void swap(backward_rule& other) noexcept
    {
        std::swap(m_closure, other.m_closure);
        std::swap(m_call, other.m_call);
        std::swap(m_destroy, other.m_destroy);
    }

    void* m_closure = nullptr;
    void (*m_call)(void*, gradient<P>&&) = nullptr;
    void (*m_destroy)(void*) noexcept = nullptr;
};

template <ScalePolicy P>
struct node_base {
    node_base() = default;
    node_base(const node_base&) = delete;
    node_base& operator=(const node_base&) = delete;
    virtual ~node_base() = default;

    /// Stops reading a borrowed value (a copy is taken); see value_node.
    virtual void own_value() {}
    /// The value, seen without its element type (what an inspection reads).
    [[nodiscard]] virtual erased_array erased_value() const = 0;

    gradient<P> grad;                              ///< accumulated cotangent of the value
    /// Gets the node's cotangent as an rvalue (the sweep has no further use for it), so a backward
    /// rule that passes it on unchanged moves it; empty for parameters and constants.
    backward_rule<P> backward;
    const void* tape = nullptr;                        ///< identity of the owning tape, if any
    std::size_t index = 0;                             ///< position on the tape
    bool requires_grad = false;
    bool watched = false;                              ///< a parameter: its gradient is kept
    /// Its backward runs in every sweep, with an empty cotangent when none reached it: the
    /// first part of a split, which joins its parts' cotangents (the others run before it).
    bool gathers = false;
};

struct borrow_t {};

/// grad += g: equal types are summed by add<Strategy> (stored over the held sum's memory, or
/// g's); different types are first widened (exactly) to float, or double if either is double,
/// which is what add's promotion would compute. A function of the gradient alone, so its 36 type
/// pairs are instantiated once per (policy, strategy) rather than once per node type.
template <class Strategy, ScalePolicy P, ScaledElement G>
void accumulate_gradient(gradient<P>& grad, ScaledArray<G, P> g)
{
    if (grad.empty()) {
        grad = gradient<P>(std::move(g));
        return;
    }
    grad = std::move(grad).visit([&](auto&& held) -> gradient<P> {
        using H = typename std::remove_cvref_t<decltype(held)>::value_type;
        if constexpr (std::same_as<H, G>) {
            return scalify::add<Strategy>(std::move(held), std::move(g));
        } else {
            using C = std::conditional_t<std::same_as<H, double> || std::same_as<G, double>, double, float>;
            return scalify::add<Strategy>(scalify::cast<C>(held), scalify::cast<C>(g));
        }
    });
}

template <ScaledElement T, ScalePolicy P, class Strategy>
struct value_node final : node_base<P> {
    explicit value_node(ScaledArray<T, P> v) : m_own(std::move(v)) {}
    /// A parameter read in place: value_and_grad's parameters outlive its tape, and the tape
    /// makes every node that something else still holds own its value before it dies.
    value_node(borrow_t, const ScaledArray<T, P>& v) : m_borrowed(&v) {}

    [[nodiscard]] const ScaledArray<T, P>& value() const noexcept { return m_borrowed ? *m_borrowed : m_own; }
    /// The value's shape (kept when the value was released).
    [[nodiscard]] std::span<const std::size_t> shape() const noexcept
    {
        if (m_released) return m_released_shape;
        const auto& s = value().shape();
        return {s.data(), s.size()};
    }
    /// Whether a consumer that is the last holder of this node may take the value: it is owned
    /// (not a parameter read in place), still here, and no backward rule reads it (the node's own
    /// rule does not, for a recorded op: see reads_no_output).
    [[nodiscard]] bool releasable() const noexcept
    {
        return m_borrowed == nullptr && !m_released && (this->tape == nullptr || !backward_reads_output);
    }
    /// Moves the value out (to a consumer that reuses its memory); the shape stays for the
    /// cotangent's check.
    [[nodiscard]] ScaledArray<T, P> release_value()
    {
        m_released_shape.assign(m_own.shape().begin(), m_own.shape().end());
        m_released = true;
        return std::move(m_own);
    }
    [[nodiscard]] erased_array erased_value() const override { return erase(value()); }
    void own_value() override
    {
        if (m_borrowed) {
            m_own = *m_borrowed;
            m_borrowed = nullptr;
        }
    }

    /// Adds one consumer's cotangent (accumulate_gradient), after checking its shape.
    template <ScaledElement G>
    void accumulate(ScaledArray<G, P> g)
    {
        const auto own = shape();
        if (!std::equal(g.shape().begin(), g.shape().end(), own.begin(), own.end())) {
            SCALIFY_THROW(shape_error(fmt::format(
                "backward: a cotangent of shape {} reached a value of shape {} (node {} of its tape): a custom "
                "op's backward function returned the wrong shape",
                shape_string(g.shape()), shape_string(own), this->index)));
        }
        accumulate_gradient<Strategy>(this->grad, std::move(g));
    }

    /// Whether the op that recorded this node reads its output in its backward rule (softmax,
    /// exp, ...: the default); reads_no_output clears it for the ops that do not.
    bool backward_reads_output = true;

private:
    ScaledArray<T, P> m_own;
    const ScaledArray<T, P>* m_borrowed = nullptr;
    std::vector<std::size_t> m_released_shape;
    bool m_released = false;
};

template <ScalePolicy P>
struct tape_state {
    tape_state() = default;
    tape_state(const tape_state&) = delete;
    tape_state& operator=(const tape_state&) = delete;
    ~tape_state()
    {
        // Backward functions share their inputs' nodes; dropping them breaks every link, so the
        // nodes of vars that escaped keep only their own values, copied if they were borrowed.
        for (auto& node : nodes) node->backward = nullptr;
        for (auto& node : nodes) {
            if (node.use_count() > 1) node->own_value();
        }
    }
    std::vector<std::shared_ptr<node_base<P>>> nodes;
};

/// What a tape reports to while an inspection is active on this thread (active_tape_observer):
/// each op recorded on the observed tape, and each cotangent its backward sweep sends on, in
/// the types they are held in. The statistics are computed by the observer from these views,
/// once per element type, not by the ops. With no observer a tape pays one test of a
/// thread-local pointer per recorded op and one per backward sweep.
class tape_observer {
public:
    tape_observer() = default;
    tape_observer(const tape_observer&) = delete;
    tape_observer& operator=(const tape_observer&) = delete;
    virtual ~tape_observer() = default;

    /// Node `index` was recorded by `op` with this output, from these inputs.
    virtual void recorded(std::size_t index, const char* op, const erased_array& output, std::span<const erased_input> inputs) = 0;
    /// The sweep is about to run node `index`'s backward rule with this (summed) cotangent.
    virtual void reached(std::size_t index, const erased_array& cotangent) = 0;

    const void* tape = nullptr;  ///< the tape observed: ops of any other tape are not reported
};

/// This thread's observer (null: none, the usual case).
[[nodiscard]] inline tape_observer*& active_tape_observer() noexcept
{
    thread_local tape_observer* observer = nullptr;
    return observer;
}

/// The active observer if it observes `tape`, else null.
[[nodiscard]] inline tape_observer* observer_of(const void* tape) noexcept
{
    tape_observer* const observer = active_tape_observer();
    return observer != nullptr && observer->tape == tape ? observer : nullptr;
}

/// Tells `observer` that `output` was recorded by `op` from the `count` nodes at `inputs` (one
/// function per policy, not per op).
template <ScalePolicy P>
void report_record(tape_observer& observer, const char* op, const node_base<P>& output, const node_base<P>* const* inputs,
                   std::size_t count)
{
    std::vector<erased_input> seen;
    seen.reserve(count);
    for (std::size_t i = 0; i < count; ++i) seen.push_back({inputs[i]->erased_value(), inputs[i]->tape, inputs[i]->index});
    observer.recorded(output.index, op, output.erased_value(), seen);
}

/// Tells `observer` the cotangent of node `index` (one function per policy, not per op).
template <ScalePolicy P>
void report_cotangent(tape_observer& observer, std::size_t index, const gradient<P>& g)
{
    g.visit([&](const auto& held) { observer.reached(index, erase(held)); });
}

template <class X>
inline constexpr bool is_var_v = false;
template <class T, class P, class S>
inline constexpr bool is_var_v<var<T, P, S>> = true;

struct var_access;

}  // namespace detail

/// A differentiable value: a ScaledArray and, if it depends on a watched parameter, its node on a
/// tape. Built from a ScaledArray it is a constant (no gradient flows into it).
template <ScaledElement T, ScalePolicy P, class Strategy>
class var {
    static_assert(ScalingStrategy<Strategy>, "the Strategy argument does not satisfy scalify::ScalingStrategy");

public:
    using value_type = T;
    using scale_policy = P;
    using strategy = Strategy;
    using array_type = ScaledArray<T, P>;

    /// An empty var (no value): assign to it before use.
    var() = default;

    /// A constant: implicit, so a ScaledArray can be passed wherever a var is expected.
    var(ScaledArray<T, P> constant)  // NOLINT(google-explicit-constructor)
        : m_node(std::make_shared<detail::value_node<T, P, Strategy>>(std::move(constant)))
    {
    }

    /// The value; autodiff_error for an empty var.
    [[nodiscard]] const ScaledArray<T, P>& value() const
    {
        if (!m_node) SCALIFY_THROW(autodiff_error("ad::var: the var is empty (default-constructed, never assigned)"));
        return m_node->value();
    }
    [[nodiscard]] const auto& shape() const { return value().shape(); }
    [[nodiscard]] float scale() const { return value().scale(); }
    [[nodiscard]] std::size_t size() const { return value().size(); }
    [[nodiscard]] std::size_t dimension() const { return value().dimension(); }
    [[nodiscard]] bool empty() const noexcept { return !m_node; }
    /// Whether a gradient flows into this value (it depends on a watched parameter).
    [[nodiscard]] bool requires_grad() const noexcept { return m_node && m_node->requires_grad; }
    /// Whether the tape it was recorded on still exists (false for constants).
    [[nodiscard]] bool tape_alive() const noexcept { return m_has_tape && !m_tape.expired(); }

private:
    friend struct detail::var_access;
    template <ScalePolicy>
    friend class tape;

    std::shared_ptr<detail::value_node<T, P, Strategy>> m_node;
    std::weak_ptr<detail::tape_state<P>> m_tape;
    bool m_has_tape = false;
};

namespace detail {

struct var_access {
    template <class T, class P, class S>
    static const std::shared_ptr<value_node<T, P, S>>& node(const var<T, P, S>& v)
    {
        if (!v.m_node) SCALIFY_THROW(autodiff_error("ad: an empty var (default-constructed, never assigned) entered an op"));
        return v.m_node;
    }
    /// The live tape of v (null for a constant); autodiff_error when its tape is gone.
    template <class T, class P, class S>
    static std::shared_ptr<tape_state<P>> live_tape(const var<T, P, S>& v, const char* op)
    {
        if (!v.m_has_tape) return nullptr;
        auto state = v.m_tape.lock();
        if (!state) {
            SCALIFY_THROW(autodiff_error(fmt::format(
                "{}: a value of shape {} is used after its tape was destroyed (did a var escape the function given to "
                "value_and_grad, or outlive its ad::tape?)",
                op, shape_string(v.value().shape()))));
        }
        return state;
    }
    /// The identity of tape t (what its nodes' `tape` holds).
    template <ScalePolicy P>
    static const void* identity(const tape<P>& t) noexcept
    {
        return t.m_state.get();
    }
    /// x's value moved out when x is its last reader (see take_expiring), else nullopt.
    template <class T, class P, class S>
    static std::optional<ScaledArray<T, P>> take(var<T, P, S>& x)
    {
        value_node<T, P, S>* const n = x.m_node.get();
        if (n == nullptr || !n->releasable()) return std::nullopt;
        // Held by x and by its tape only: no other var or recorded consumer can read it again.
        const long holders = n->tape == nullptr ? 1 : 2;
        if (x.m_node.use_count() != holders || observer_of(n->tape) != nullptr) return std::nullopt;
        return n->release_value();
    }
    /// Empties x (after an op took its value: x was an expiring argument).
    template <class T, class P, class S>
    static void clear(var<T, P, S>& x) noexcept
    {
        x.m_node.reset();
        x.m_tape.reset();
        x.m_has_tape = false;
    }
    template <class T, class P, class S>
    static void mark_output_unread(const var<T, P, S>& x) noexcept
    {
        if (x.m_node) x.m_node->backward_reads_output = false;
    }
    template <class T, class P, class S>
    static var<T, P, S> make(std::shared_ptr<value_node<T, P, S>> node, const std::shared_ptr<tape_state<P>>& state)
    {
        var<T, P, S> out;
        out.m_node = std::move(node);
        if (state) {
            out.m_tape = state;
            out.m_has_tape = true;
        }
        return out;
    }
};

/// The value of an expiring argument x, moved out of its node when nothing can read it again:
/// only x and its tape hold the node, the node's own backward rule does not read it (see
/// reads_no_output), it is not a parameter read in place, and no inspection observes the tape.
/// Then an op reuses its memory (a reshape, a scalar factor, a mask, an add in place) instead of
/// copying it; the op's own backward rule must not read that input's value (only its shape,
/// captured). nullopt otherwise: the op reads x.value() as for an lvalue.
template <class T, class P, class S>
[[nodiscard]] std::optional<ScaledArray<T, P>> take_expiring(var<T, P, S>& x)
{
    return var_access::take(x);
}

/// x, marked as the output of an op whose backward rule reads its inputs only (add, matmul,
/// reshape, ...): a consumer that expires it may take its value (take_expiring).
template <class T, class P, class S>
[[nodiscard]] var<T, P, S> reads_no_output(var<T, P, S> x) noexcept
{
    var_access::mark_output_unread(x);
    return x;
}

/// Sends cotangent c to the input node n, unless c is no_gradient or n needs none.
template <class Node, class Cotangent>
void send(Node& n, Cotangent&& c)
{
    if constexpr (!std::same_as<std::remove_cvref_t<Cotangent>, no_gradient>) {
        if (n.requires_grad) n.accumulate(std::forward<Cotangent>(c));
    }
}

/// How an op's backward rule receives and returns cotangents. A rule's body is compiled once per
/// type its cotangent can arrive in, so the rule decides how many copies of it exist.
///
/// - computes_in_value_type (every built-in op but the three below): the cotangent arrives in the
///   compute type of the op's output (float32, or float64 for float64 values): a narrower one is
///   widened exactly, a float64 one reaching a float32 value is rounded to float32. The rule
///   computes there and returns its cotangents in that type. One body per op.
/// - returns_cotangent_types (cast_grad): the same entry; the results
///   have the types the rule gives them (a narrow type: what these rules exist for).
/// - sees_narrow_cotangents<Keeps> (matmul): a 16- or 8-bit cotangent type G for which
///   Keeps::template keeps<G> holds arrives as it was sent, one body per such type, because the
///   tensor-core models multiply fp16, bf16 and fp8 cotangents as their codes; every other
///   cotangent arrives in the output's compute type as above (for a matmul: the G no model
///   multiplies by its operands, whose products are the same on the widened values). The results
///   keep the types the rule gives them.
/// - sees_cotangent_types (custom_op): the rule sees the cotangent in the type it was sent in, one
///   body per gradient type, and its results are sent as they are.
struct computes_in_value_type {};
struct returns_cotangent_types {};
template <class Keeps>
struct sees_narrow_cotangents {};
struct sees_cotangent_types {};

template <class Rule>
inline constexpr bool is_sees_narrow_cotangents = false;
template <class Keeps>
inline constexpr bool is_sees_narrow_cotangents<sees_narrow_cotangents<Keeps>> = true;

template <class Rule>
concept CotangentRule = std::same_as<Rule, computes_in_value_type> || std::same_as<Rule, returns_cotangent_types> ||
                        is_sees_narrow_cotangents<Rule> || std::same_as<Rule, sees_cotangent_types>;

/// Keeps of sees_narrow_cotangents<Keeps> for a rule that runs on Keeps' narrow types.
template <class Rule>
struct narrow_cotangents_kept;
template <class Keeps>
struct narrow_cotangents_kept<sees_narrow_cotangents<Keeps>> {
    using type = Keeps;
};

/// The cotangent in element type C (moved when it holds C, else converted to nearest even: exact
/// for every narrower type). One function per (C, P), shared by every op.
template <ScaledElement C, ScalePolicy P>
[[nodiscard]] ScaledArray<C, P> take_as(gradient<P>&& g)
{
    if (g.template holds<C>()) return std::get<ScaledArray<C, P>>(std::move(g).variant_rvalue());
    return g.template as<C>();
}

/// Joins the tape of input v (if it records) into `state`, the tape of the op being recorded:
/// autodiff_error when the op's inputs come from two tapes. Returns v's node.
template <ScalePolicy P, class V>
[[nodiscard]] const auto& join_tape(std::shared_ptr<tape_state<P>>& state, const V& v, const char* op)
{
    auto live = var_access::live_tape(v, op);
    if (live && state && live != state) {
        SCALIFY_THROW(autodiff_error(fmt::format("{}: inputs come from two different tapes", op)));
    }
    if (live) state = std::move(live);
    return var_access::node(v);
}

/// Puts an op's output node on `state`'s tape, and tells its observer, if any, with the inputs'
/// nodes: `inputs`, a range of pointers to them (raw or shared), is read only then.
template <ScalePolicy P, class Inputs>
void place_on_tape(node_base<P>& node, tape_state<P>& state, const char* op, const Inputs& inputs)
{
    node.requires_grad = true;
    node.tape = &state;
    node.index = state.nodes.size();
    if (tape_observer* const observer = observer_of(&state)) [[unlikely]] {
        std::vector<const node_base<P>*> bases;
        for (const auto& input : inputs) bases.push_back(std::to_address(input));
        report_record(*observer, op, node, bases.data(), bases.size());
    }
}

/// Records an op. `backward(g, output, inputs...)` gets the output's cotangent and the values of
/// the output and of every input, and returns one cotangent (or no_gradient) per input; Rule says
/// in which types (see CotangentRule).
template <class Strategy, CotangentRule Rule = computes_in_value_type, ScaledElement T, ScalePolicy P, class... Inputs,
          class Backward>
[[nodiscard]] var<T, P, Strategy> record_op(const char* op, ScaledArray<T, P> output, const std::tuple<Inputs...>& inputs,
                                            Backward backward)
{
    static_assert((is_var_v<Inputs> && ...), "custom_op: every input must be an ad::var");
    static_assert((std::same_as<typename Inputs::scale_policy, P> && ...),
                  "custom_op: inputs and output must share one ScalePolicy");
    static_assert((std::same_as<typename Inputs::strategy, Strategy> && ...),
                  "custom_op: inputs must be vars of the same Strategy");

    std::shared_ptr<tape_state<P>> state;
    bool requires_grad = false;
    std::array<const node_base<P>*, sizeof...(Inputs)> input_bases{};  // for an observer
    std::size_t input_count = 0;
    std::apply(
        [&](const auto&... in) {
            const auto visit_input = [&](const auto& v) {
                const auto& input = join_tape(state, v, op);
                requires_grad = requires_grad || input->requires_grad;
                input_bases[input_count++] = input.get();
            };
            (visit_input(in), ...);
        },
        inputs);

    auto node = std::make_shared<value_node<T, P, Strategy>>(std::move(output));
    if (!state || !requires_grad) return var_access::make(std::move(node), std::shared_ptr<tape_state<P>>{});
    place_on_tape<P>(*node, *state, op, input_bases);
    auto input_nodes = std::apply([](const auto&... in) { return std::make_tuple(var_access::node(in)...); }, inputs);
    // The closure lives in the node, so the raw pointer to it is valid whenever it runs.
    node->backward = [self = node.get(), input_nodes = std::move(input_nodes),
                      backward = std::move(backward)](gradient<P>&& g) {
        // One index expansion rather than std::apply's chain of calls: this body is instantiated
        // for every op (and, for sees_cotangent_types, every cotangent type).
        const auto run = [&](auto&& cotangent) {
            [&]<std::size_t... I>(std::index_sequence<I...>) {
                auto results = backward(std::move(cotangent), self->value(), std::get<I>(input_nodes)->value()...);
                static_assert(std::tuple_size_v<decltype(results)> == sizeof...(Inputs),
                              "custom_op: the backward function must return one cotangent (or ad::no_gradient) per input");
                (send(*std::get<I>(input_nodes), std::move(std::get<I>(results))), ...);
            }(std::index_sequence_for<Inputs...>{});
        };
        if constexpr (std::same_as<Rule, sees_cotangent_types>) {
            std::move(g).visit(run);
        } else if constexpr (is_sees_narrow_cotangents<Rule>) {
            using keeps = typename narrow_cotangents_kept<Rule>::type;
            bool ran = false;
            std::move(g).visit([&]<class G, class GP>(ScaledArray<G, GP>&& cotangent) {
                if constexpr (!std::same_as<G, float> && !std::same_as<G, double> && keeps::template keeps<G>) {
                    ran = true;
                    run(std::move(cotangent));
                }
            });
            if (!ran) run(take_as<compute_t<T>>(std::move(g)));  // the visit moved nothing out
        } else {
            run(take_as<compute_t<T>>(std::move(g)));
        }
    };
    state->nodes.push_back(node);
    return var_access::make(std::move(node), state);
}

/// Records an op over a run-time number of inputs of one type (concatenate): `backward(g, i)`
/// returns the cotangent of input i.
template <class Strategy, ScaledElement T, ScalePolicy P, ScaledElement I, class Backward>
[[nodiscard]] var<T, P, Strategy> record_op_n(const char* op, ScaledArray<T, P> output,
                                              const std::vector<var<I, P, Strategy>>& inputs, Backward backward)
{
    std::shared_ptr<tape_state<P>> state;
    bool requires_grad = false;
    std::vector<std::shared_ptr<value_node<I, P, Strategy>>> input_nodes;
    for (const auto& v : inputs) {
        input_nodes.push_back(join_tape(state, v, op));
        requires_grad = requires_grad || input_nodes.back()->requires_grad;
    }
    auto node = std::make_shared<value_node<T, P, Strategy>>(std::move(output));
    if (!state || !requires_grad) return var_access::make(std::move(node), std::shared_ptr<tape_state<P>>{});
    place_on_tape<P>(*node, *state, op, input_nodes);
    // computes_in_value_type (see CotangentRule).
    node->backward = [input_nodes = std::move(input_nodes), backward = std::move(backward)](gradient<P>&& g) {
        const auto cotangent = take_as<compute_t<T>>(std::move(g));
        for (std::size_t i = 0; i < input_nodes.size(); ++i) {
            if (input_nodes[i]->requires_grad) input_nodes[i]->accumulate(backward(cotangent, i));
        }
    };
    state->nodes.push_back(node);
    return var_access::make(std::move(node), state);
}

}  // namespace detail

/// Records a user-defined differentiable op (torch.autograd.Function, jax.custom_vjp): `output`
/// was computed from `inputs`, a tuple of vars sharing P and Strategy. During the backward sweep
/// `backward(g)` or `backward(g, input_values...)` is called with the output's cotangent as
/// `const ScaledArray<G, P>&` (G is decided at run time: write a generic callable) and returns a
/// std::tuple with one entry per input: a ScaledArray cotangent of that input's shape, or
/// ad::no_gradient. The result is a constant when no input needs a gradient.
///
///     auto y = ad::custom_op<S>(scalify::mul(x.value(), 3.0), std::tuple{x},
///                               [](const auto& g) { return std::tuple{scalify::mul(g, 3.0)}; });
template <class Strategy, ScaledElement T, ScalePolicy P, class... Inputs, class Backward>
[[nodiscard]] var<T, P, Strategy> custom_op(ScaledArray<T, P> output, const std::tuple<Inputs...>& inputs, Backward backward)
{
    return detail::record_op<Strategy, detail::sees_cotangent_types>(
        "custom_op", std::move(output), inputs, [backward = std::move(backward)](const auto& g, const auto&, const auto&... in) {
            if constexpr (std::is_invocable_v<const Backward&, decltype(g), decltype(in)...>) return backward(g, in...);
            else return backward(g);
        });
}

/// The record of one differentiable computation. Watch parameters, compute, call backward once
/// per output, read gradients. Not copyable; destroying it frees the graph.
template <ScalePolicy P>
class tape {
public:
    tape() : m_state(std::make_shared<detail::tape_state<P>>()) {}
    tape(const tape&) = delete;
    tape& operator=(const tape&) = delete;
    tape(tape&&) noexcept = default;
    tape& operator=(tape&&) noexcept = default;

    /// A parameter: a var whose gradient this tape computes.
    template <class Strategy = default_scaling, ScaledElement T>
    [[nodiscard]] var<T, P, Strategy> watch(ScaledArray<T, P> array)
    {
        return watched(std::make_shared<detail::value_node<T, P, Strategy>>(std::move(array)));
    }

    /// watch without copying: the var reads `array` in place for as long as the tape lives (a var
    /// that outlives the tape gets a copy when the tape dies). `array` must outlive the tape and
    /// not change while it lives: value_and_grad's parameters.
    template <class Strategy = default_scaling, ScaledElement T>
    [[nodiscard]] var<T, P, Strategy> watch_in_place(const ScaledArray<T, P>& array)
    {
        return watched(std::make_shared<detail::value_node<T, P, Strategy>>(detail::borrow_t{}, array));
    }

    /// Number of nodes recorded (parameters included).
    [[nodiscard]] std::size_t size() const noexcept { return m_state->nodes.size(); }

    /// Back-propagates `seed` (the cotangent of `output`, same shape; any ScaledElement type)
    /// through every node the output depends on. Parameters' gradients add up over calls.
    template <ScaledElement T, class Strategy, ScaledElement G>
    void backward(const var<T, P, Strategy>& output, ScaledArray<G, P> seed)
    {
        const auto& node = own_node(output, "tape::backward");
        if (!std::equal(seed.shape().begin(), seed.shape().end(), output.shape().begin(), output.shape().end())) {
            SCALIFY_THROW(shape_error(fmt::format("tape::backward: seed of shape {} for an output of shape {}",
                                                  shape_string(seed.shape()), shape_string(output.shape()))));
        }
        node->accumulate(std::move(seed));
        detail::tape_observer* const observer = detail::observer_of(m_state.get());  // an inspection's
        for (std::size_t i = node->index + 1; i-- > 0;) {
            auto& n = *m_state->nodes[i];
            // Only recorded ops have a backward function; parameters (which keep their gradient) do not.
            if ((n.grad.empty() && !n.gathers) || !n.backward) continue;
            if (observer != nullptr && !n.grad.empty()) [[unlikely]] detail::report_cotangent(*observer, n.index, n.grad);
            n.backward(std::move(n.grad));
            n.grad = {};  // an intermediate cotangent is dead once sent on
        }
    }

    /// Back-propagates from a scalar output (one element) with seed 1; autodiff_error otherwise.
    template <ScaledElement T, class Strategy>
    void backward(const var<T, P, Strategy>& output)
    {
        if (output.size() != 1) {
            SCALIFY_THROW(autodiff_error(fmt::format(
                "tape::backward: the output has shape {} ({} elements); a gradient needs a scalar output or a seed "
                "cotangent (tape.backward(output, seed))",
                shape_string(output.shape()), output.size())));
        }
        using S = std::conditional_t<std::same_as<T, double>, double, float>;
        xt::xarray<S> ones = xt::xarray<S>::from_shape(output.shape());
        ones.fill(S(1));
        backward(output, ScaledArray<S, P>(std::move(ones), 1.0f));
    }

    /// The gradient of a watched parameter; autodiff_error when none reached it (the output
    /// does not depend on it) or when `parameter` was not watched by this tape.
    template <ScaledElement T, class Strategy>
    [[nodiscard]] const gradient<P>& gradient_of(const var<T, P, Strategy>& parameter) const
    {
        const auto& node = own_node(parameter, "tape::gradient_of");
        if (!node->watched) {
            SCALIFY_THROW(autodiff_error(fmt::format(
                "tape::gradient_of: the value of shape {} is not a watched parameter", shape_string(parameter.shape()))));
        }
        if (node->grad.empty()) {
            SCALIFY_THROW(autodiff_error(fmt::format(
                "tape::gradient_of: the parameter of shape {} (node {}) has no gradient: the output does not "
                "depend on it, or its gradient was taken",
                shape_string(parameter.shape()), node->index)));
        }
        return node->grad;
    }

    /// gradient_of, moved out of the tape instead of copied (afterwards the tape holds none for
    /// this parameter: a second take or gradient_of is an autodiff_error).
    template <ScaledElement T, class Strategy>
    [[nodiscard]] gradient<P> take_gradient(const var<T, P, Strategy>& parameter)
    {
        (void)gradient_of(parameter);  // the same checks
        auto& held = own_node(parameter, "tape::take_gradient")->grad;
        gradient<P> out = std::move(held);
        held = {};
        return out;
    }

private:
    friend struct detail::var_access;

    template <class T, class Strategy>
    [[nodiscard]] var<T, P, Strategy> watched(std::shared_ptr<detail::value_node<T, P, Strategy>> node)
    {
        node->requires_grad = true;
        node->watched = true;
        node->tape = m_state.get();
        node->index = m_state->nodes.size();
        m_state->nodes.push_back(node);
        return detail::var_access::make(std::move(node), m_state);
    }

    template <ScaledElement T, class Strategy>
    const std::shared_ptr<detail::value_node<T, P, Strategy>>& own_node(const var<T, P, Strategy>& v, const char* op) const
    {
        const auto& node = detail::var_access::node(v);
        if (node->tape != m_state.get()) {
            SCALIFY_THROW(autodiff_error(fmt::format("{}: the value of shape {} was not recorded on this tape{}", op,
                                                     shape_string(v.shape()),
                                                     node->tape == nullptr ? " (it is a constant)" : "")));
        }
        return node;
    }

    std::shared_ptr<detail::tape_state<P>> m_state;
};

namespace detail {

/// Makes `observer` (when not null) this thread's observer of tape t for the scope's lifetime,
/// restoring the previous one on exit (also when an exception leaves the scope).
class observing_scope {
public:
    template <ScalePolicy P>
    observing_scope(tape_observer* observer, const tape<P>& t) noexcept : m_observer(observer)
    {
        if (observer == nullptr) return;
        observer->tape = var_access::identity(t);
        m_previous = std::exchange(active_tape_observer(), observer);
    }
    ~observing_scope()
    {
        if (m_observer != nullptr) active_tape_observer() = m_previous;
    }
    observing_scope(const observing_scope&) = delete;
    observing_scope& operator=(const observing_scope&) = delete;

private:
    tape_observer* m_observer;
    tape_observer* m_previous = nullptr;
};

}  // namespace detail

}  // namespace scalify::ad
