#pragma once
/// \file tensor_core/accumulation.hpp
/// Which accumulation scalify's matmul runs: exact_accumulation (float32, Eigen's GEMM, the
/// default) or a GPU's (or a CPU unit's) GEMM models. Chosen per call by a model tag, or for a
/// region of code by a thread-local, nestable scope that every matmul without a tag consults
/// (matmul_vjp, the autodiff layer and model code included), restored on scope exit, exceptions
/// included:
///
///     auto y = matmul(x, w, tensor_core::h100_cublaslt_fp8_fast{});     // this call
///     {
///         tensor_core::accumulation_scope<tensor_core::h100_cublaslt_fp8> h100;   // this region
///         train_step(...);                                               // forward and backward
///     }
///     tensor_core::accumulation_scope<> chosen(flag);   // run-time: "exact", "v100", "a100", "ada",
///                                                       // "h100", "h100-fast", "b200", "amx",
///                                                       // "b200-f8f6f4", "mi100", "mi250", "mi300", and
///                                                       // "a100+tf32" ... (float32 products as tf32)
///
/// A run-time choice names a GPU (the `accumulation` enum): each operand pair runs the GEMM model
/// of the unit that GPU has for it (accumulation_gemms below), exact float32 where it has none.
/// The choice is held as a table of type-erased GEMMs per operand pair (gemm_table): matmul's
/// body is compiled once whatever the models, and a model's engine is compiled only where a scope
/// that can select it is (or in scalify::compiled).

#include <scalify/detail/scoped_setting.hpp>
#include <scalify/error.hpp>
#include <scalify/numeric/dtype.hpp>
#include <scalify/tensor_core/amx.hpp>
#include <scalify/tensor_core/blackwell.hpp>
#include <scalify/tensor_core/cdna.hpp>
#include <scalify/tensor_core/gemm.hpp>
#include <scalify/tensor_core/model.hpp>

#include <fmt/format.h>

#include <concepts>
#include <cstddef>
#include <iterator>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace scalify::tensor_core {

/// float32 accumulation as the CPU does it (Eigen's GEMM: float multiply-adds rounded to nearest
/// even), matmul's default. Not bit-exact to any GPU; docs/tensor_core.md compares it.
struct exact_accumulation {
    static constexpr const char* name = "exact";
};

/// What a matmul may accumulate with: exact_accumulation or a GEMM model whose operands carry no
/// block scales (the NVIDIA units, AMX, CDNA).
template <class M>
concept AccumulationModel =
    std::same_as<M, exact_accumulation> || (GemmModel<M> && M::instruction::scale_block == 0);

namespace detail {
/// Whether GEMM model M's instruction takes TA x TB.
template <class M, class TA, class TB>
inline constexpr bool gemm_takes = false;
template <GemmModel M, class TA, class TB>
inline constexpr bool gemm_takes<M, TA, TB> = M::instruction::template takes<TA, TB>;
}  // namespace detail

/// The GEMM model a matmul of TA x TB data runs under accumulation model Model, or void for
/// exact float32: Model itself where its instruction takes the pair; under the two H100 FP8
/// models, f16 x f16 and bf16 x bf16 run an HMMA chain (h100_hmma_chain: fast accumulation is an
/// FP8 setting, and cuBLAS's 16-bit GEMMs keep a float32 accumulator per chain); every other pair
/// (float, double, other minifloats, mixed widths) stays exact. Specialise it for other models.
template <AccumulationModel Model, class TA, class TB>
struct operand_gemm {
    using type = std::conditional_t<detail::gemm_takes<Model, TA, TB>, Model, void>;
};
template <class TA, class TB>
    requires(same_type_of<Eigen::half, Eigen::bfloat16>::template contains<TA, TB>)
struct operand_gemm<h100_cublaslt_fp8, TA, TB> {
    using type = h100_hmma_chain;
};
template <class TA, class TB>
    requires(same_type_of<Eigen::half, Eigen::bfloat16>::template contains<TA, TB>)
struct operand_gemm<h100_cublaslt_fp8_fast, TA, TB> {
    using type = h100_hmma_chain;
};

template <AccumulationModel Model, class TA, class TB>
using operand_gemm_t = typename operand_gemm<Model, TA, TB>::type;

// ---------------------------------------------------------------------------------------------
// The run-time choice: a GPU

/// The GPUs (and CPU unit) a scope can select; each runs its own GEMM model per operand pair
/// (accumulation_gemms).
enum class accumulation {
    exact,        ///< exact_accumulation for every pair
    v100,         ///< f16: v100_hmma_chain (no bf16, fp8 or tf32 unit)
    a100,         ///< f16, bf16: a100_hmma_chain; tf32: a100_tf32_chain (no fp8 unit)
    ada,          ///< fp8: ada_qmma_chain; f16, bf16: ada_hmma_chain; tf32: ada_tf32_chain
    h100,         ///< fp8: h100_cublaslt_fp8 (cuBLASLt default: promotion every 128 of K); f16, bf16:
                  ///< h100_hmma_chain; tf32: h100_tf32_chain
    h100_fast,    ///< the same, fp8 by h100_cublaslt_fp8_fast (use_fast_accum=True: one chain)
    b200,         ///< fp8: b200_qmma_chain (mma.sync); f16, bf16: b200_hmma_chain; tf32: b200_tf32_chain
    amx,          ///< bf16: amx_bf16_gemm (Intel AMX TDPBF16PS); f16: amx_fp16_gemm (AMX-FP16 TDPFP16PS,
                  ///< not captured); no fp8 or tf32 unit
    b200_f8f6f4,  ///< as b200, fp8 by b200_f8f6f4_chain (tcgen05.mma kind::f8f6f4)
    mi100,        ///< f16, bf16: mi100_mfma_chain (AMD CDNA1; no fp8 or xf32 unit)
    mi250,        ///< f16, bf16: mi250_mfma_chain (AMD CDNA2, the bf16_1k instructions)
    mi300         ///< f16, bf16: mi300_mfma_chain (AMD CDNA3); tf32: its xf32 unit. Its fp8 units take
                  ///< fnuz formats, so e4m3fn/e5m2 products stay exact
};

/// Every enumerator, in the order messages list them.
inline constexpr accumulation all_accumulations[] = {
    accumulation::exact, accumulation::v100, accumulation::a100,        accumulation::ada,
    accumulation::h100,  accumulation::h100_fast, accumulation::b200,   accumulation::amx,
    accumulation::b200_f8f6f4, accumulation::mi100, accumulation::mi250, accumulation::mi300};

namespace detail {
template <class... Models>
struct gemm_list {};
}  // namespace detail

/// The GEMM models of a GPU, most specific first: a pair runs the first whose instruction takes
/// it. `tf32` is the float32 x float32 GEMM (void: none), used only where a scope asks for it;
/// `name` the command-line spelling. One line per GPU: a GPU added to `accumulation` (and
/// all_accumulations) adds one here, and nothing else.
template <accumulation Mode>
struct accumulation_gemms {
    using models = detail::gemm_list<>;
    using tf32 = void;
    static constexpr std::string_view name = "exact";
};
template <class Tf32, class... Models>
struct accumulation_gemms_of {
    using models = detail::gemm_list<Models...>;
    using tf32 = Tf32;
};
// clang-format off
template <> struct accumulation_gemms<accumulation::v100> : accumulation_gemms_of<void, v100_hmma_chain> { static constexpr std::string_view name = "v100"; };
template <> struct accumulation_gemms<accumulation::a100> : accumulation_gemms_of<a100_tf32_chain, a100_hmma_chain> { static constexpr std::string_view name = "a100"; };
template <> struct accumulation_gemms<accumulation::ada> : accumulation_gemms_of<ada_tf32_chain, ada_qmma_chain, ada_hmma_chain> { static constexpr std::string_view name = "ada"; };
template <> struct accumulation_gemms<accumulation::h100> : accumulation_gemms_of<h100_tf32_chain, h100_cublaslt_fp8, h100_hmma_chain> { static constexpr std::string_view name = "h100"; };
template <> struct accumulation_gemms<accumulation::h100_fast> : accumulation_gemms_of<h100_tf32_chain, h100_cublaslt_fp8_fast, h100_hmma_chain> { static constexpr std::string_view name = "h100-fast"; };
template <> struct accumulation_gemms<accumulation::b200> : accumulation_gemms_of<b200_tf32_chain, b200_qmma_chain, b200_hmma_chain> { static constexpr std::string_view name = "b200"; };
template <> struct accumulation_gemms<accumulation::b200_f8f6f4> : accumulation_gemms_of<b200_tf32_chain, b200_f8f6f4_chain, b200_hmma_chain> { static constexpr std::string_view name = "b200-f8f6f4"; };
template <> struct accumulation_gemms<accumulation::mi100> : accumulation_gemms_of<void, mi100_mfma_chain> { static constexpr std::string_view name = "mi100"; };
template <> struct accumulation_gemms<accumulation::mi250> : accumulation_gemms_of<void, mi250_mfma_chain> { static constexpr std::string_view name = "mi250"; };
template <> struct accumulation_gemms<accumulation::mi300> : accumulation_gemms_of<mi300_mfma_chain, mi300_mfma_chain> { static constexpr std::string_view name = "mi300"; };
template <> struct accumulation_gemms<accumulation::amx> : accumulation_gemms_of<void, amx_bf16_gemm, amx_fp16_gemm> { static constexpr std::string_view name = "amx"; };
// clang-format on

namespace detail {
/// f.template operator()<M>() for the enumerator M equal to mode (exact where none is).
template <class F, std::size_t... I>
[[nodiscard]] constexpr auto visit_accumulation(accumulation mode, const F& f, std::index_sequence<I...>)
{
    auto result = f.template operator()<accumulation::exact>();
    static_cast<void>(((mode == all_accumulations[I] ? (result = f.template operator()<all_accumulations[I]>(), true)
                                                     : false) ||
                       ...));
    return result;
}
template <class F>
[[nodiscard]] constexpr auto visit_accumulation(accumulation mode, const F& f)
{
    return visit_accumulation(mode, f, std::make_index_sequence<std::size(all_accumulations)>{});
}
}  // namespace detail

/// The command-line spelling: "exact", "v100", "a100", "ada", "h100", "h100-fast", "b200", "amx",
/// "b200-f8f6f4", "mi100", "mi250", "mi300".
[[nodiscard]] constexpr std::string_view to_string(accumulation mode) noexcept
{
    return detail::visit_accumulation(mode, []<accumulation M>() { return accumulation_gemms<M>::name; });
}

/// Whether Mode's GPU has a tf32 unit (so that "+tf32" may follow its name).
template <accumulation Mode>
inline constexpr bool has_tf32 = !std::is_void_v<typename accumulation_gemms<Mode>::tf32>;

[[nodiscard]] constexpr bool accumulation_has_tf32(accumulation mode) noexcept
{
    return detail::visit_accumulation(mode, []<accumulation M>() { return has_tf32<M>; });
}

/// A run-time choice: a GPU, and whether its float32 products run on its tf32 unit. tf32 is off
/// unless asked for, as PyTorch's torch.backends.cuda.matmul.allow_tf32 (False by default):
/// float32 products then stay exact float32 on every GPU.
struct accumulation_choice {
    accumulation mode = accumulation::exact;
    bool tf32 = false;
    constexpr accumulation_choice() noexcept = default;
    constexpr accumulation_choice(accumulation m, bool t = false) noexcept : mode(m), tf32(t) {}  // NOLINT: implicit
    friend constexpr bool operator==(const accumulation_choice&, const accumulation_choice&) = default;
};

/// "h100", or "h100+tf32" with tf32.
[[nodiscard]] inline std::string to_string(accumulation_choice choice)
{
    return std::string(to_string(choice.mode)) + (choice.tf32 ? "+tf32" : "");
}

/// The spellings parse_accumulation takes, for messages: "exact, v100, a100, ..., amx; +tf32 after
/// a100, ada, h100, h100-fast or b200".
[[nodiscard]] inline std::string accumulation_choices()
{
    std::string names, tf32;
    for (const accumulation mode : all_accumulations) {
        names += (names.empty() ? "" : ", ") + std::string(to_string(mode));
        if (accumulation_has_tf32(mode)) tf32 += (tf32.empty() ? "" : ", ") + std::string(to_string(mode));
    }
    return names + " (" + tf32 + " also with +tf32: float32 products on the tf32 unit)";
}

/// A GPU's name as to_string writes it, optionally followed by "+tf32" where the GPU has a tf32
/// unit; config_error naming the text and every choice otherwise.
[[nodiscard]] inline accumulation_choice parse_accumulation(std::string_view text)
{
    constexpr std::string_view suffix = "+tf32";
    const bool tf32 = text.size() > suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
    const std::string_view name = tf32 ? text.substr(0, text.size() - suffix.size()) : text;
    for (const accumulation mode : all_accumulations) {
        if (name != to_string(mode)) continue;
        if (tf32 && !accumulation_has_tf32(mode)) {
            SCALIFY_THROW(config_error(fmt::format("accumulation '{}': {} has no tf32 unit; choose one of {}", text,
                                                   name, accumulation_choices())));
        }
        return {mode, tf32};
    }
    SCALIFY_THROW(config_error(fmt::format("accumulation '{}' is not one of {}", text, accumulation_choices())));
}

// ---------------------------------------------------------------------------------------------
// The table a choice becomes

/// A GEMM over float32 operands holding values of the pair's formats (row-major, a M x K, b K x
/// N): tensor_core::detail::gemm_into_on_grid of one model and pair, type-erased.
using grid_gemm_fn = void (*)(const float* a, const float* b, std::size_t m, std::size_t k, std::size_t n, float* out);

/// What one operand pair runs: a model's GEMM, or nothing (exact float32).
struct pair_gemm {
    const char* model = nullptr;  ///< the GEMM model's name; nullptr: exact float32
    grid_gemm_fn run = nullptr;
};

/// A choice's GEMM per operand pair, indexed by the operands' dtypes (float32 also stands for
/// any other type computed in float).
struct gemm_table {
    accumulation_choice choice;
    pair_gemm pairs[5][5];
    [[nodiscard]] constexpr const pair_gemm& operator()(dtype a, dtype b) const noexcept
    {
        return pairs[static_cast<int>(a)][static_cast<int>(b)];
    }
};

namespace detail {

/// The element type of a dtype's index.
template <std::size_t I>
using dtype_type = std::tuple_element_t<I, std::tuple<float, Eigen::half, Eigen::bfloat16, float8_e4m3fn, float8_e5m2>>;

/// The first of Models whose instruction takes TA x TB, else void.
template <class TA, class TB, class List>
struct first_taking {
    using type = void;
};
template <class TA, class TB, class M, class... Rest>
struct first_taking<TA, TB, gemm_list<M, Rest...>> {
    using type = std::conditional_t<gemm_takes<M, TA, TB>, M, typename first_taking<TA, TB, gemm_list<Rest...>>::type>;
};

/// The model whose compiled engine runs M: M itself, or a model of the same arithmetic (same
/// instruction parameters and chaining), so that GPUs sharing a unit share one engine.
template <class M>
struct engine_of {
    using type = M;
};
template <>
struct engine_of<ada_hmma_chain> {
    using type = a100_hmma_chain;
};
template <>
struct engine_of<ada_tf32_chain> {
    using type = a100_tf32_chain;
};
template <>
struct engine_of<b200_hmma_chain> {
    using type = h100_hmma_chain;
};
template <>
struct engine_of<b200_tf32_chain> {
    using type = h100_tf32_chain;
};

template <class M, class E>
inline constexpr bool same_arithmetic = std::same_as<M, E>;
template <GemmModel M, GemmModel E>
    requires(!std::same_as<M, E> && InnerProductModel<typename M::instruction> && InnerProductModel<typename E::instruction>)
inline constexpr bool same_arithmetic<M, E> =
    M::promotion_interval == E::promotion_interval && M::instruction::alignment_bits == E::instruction::alignment_bits &&
    M::instruction::result_bits == E::instruction::result_bits && M::instruction::k == E::instruction::k &&
    std::same_as<typename M::instruction::operands, typename E::instruction::operands> &&
    std::same_as<typename M::instruction::rules, typename E::instruction::rules> &&
    std::same_as<typename M::instruction::accumulator, typename E::instruction::accumulator>;

/// The pair_gemm of model M (void: exact) for operands of formats TA and TB.
template <class M, class TA, class TB>
[[nodiscard]] constexpr pair_gemm pair_gemm_of() noexcept
{
    if constexpr (std::is_void_v<M>) {
        return {};
    } else {
        using E = typename engine_of<M>::type;
        static_assert(same_arithmetic<M, E>, "engine_of must name a model of the same arithmetic");
        return {M::name, &tensor_core::detail::gemm_into_on_grid<E, TA, TB>};
    }
}

/// The table of a choice: every pair the GPU has a unit for runs that unit's model; with Tf32,
/// every other pair computed in float runs the tf32 GEMM over its float32 values (exact in tf32:
/// fp8, f16 and bf16 values have at most 10 mantissa bits), as a GPU multiplies operands it widened
/// to float32.
template <accumulation Mode, bool Tf32>
[[nodiscard]] constexpr gemm_table make_gemm_table() noexcept
{
    gemm_table table;
    table.choice = {Mode, Tf32};
    using tf32 = std::conditional_t<Tf32, typename accumulation_gemms<Mode>::tf32, void>;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        const auto row = [&]<std::size_t A>(std::integral_constant<std::size_t, A>) {
            const auto cell = [&]<std::size_t B>(std::integral_constant<std::size_t, B>) {
                using TA = dtype_type<A>;
                using TB = dtype_type<B>;
                // float32 x float32 runs only on a tf32 unit asked for (MI300's chain takes it as xf32).
                using M = std::conditional_t<std::same_as<TA, float> && std::same_as<TB, float>, void,
                                             typename first_taking<TA, TB, typename accumulation_gemms<Mode>::models>::type>;
                if constexpr (!std::is_void_v<M>) table.pairs[A][B] = pair_gemm_of<M, TA, TB>();
                else table.pairs[A][B] = pair_gemm_of<tf32, float, float>();
            };
            (cell(std::integral_constant<std::size_t, I>{}), ...);
        };
        (row(std::integral_constant<std::size_t, I>{}), ...);
    }(std::make_index_sequence<5>{});
    return table;
}

template <accumulation Mode, bool Tf32>
inline constexpr gemm_table gemm_table_of = make_gemm_table<Mode, Tf32>();

/// The table of a run-time choice (nullptr for exact). The one place every GPU's engines are
/// referenced: a program compiles them where it makes a run-time choice. A template so that
/// scalify::compiled can hold its one instance (detail/compiled_instances.hpp).
template <class = void>
[[nodiscard]] const gemm_table* gemm_table_for(accumulation_choice choice) noexcept
{
    const auto pick = [&]<accumulation Mode>() -> const gemm_table* {
        if constexpr (has_tf32<Mode>) {
            if (choice.tf32) return &gemm_table_of<Mode, true>;
        }
        return &gemm_table_of<Mode, false>;
    };
    return visit_accumulation(choice.mode, [&]<accumulation M>() -> const gemm_table* {
        if constexpr (M == accumulation::exact) return nullptr;
        else return pick.template operator()<M>();
    });
}
#ifdef SCALIFY_SEPARATE_COMPILATION  // scalify::compiled holds it (detail/compiled_instances.hpp)
extern template const gemm_table* gemm_table_for<void>(accumulation_choice) noexcept;
#endif

/// The thread's choice: its table (nullptr: exact float32 everywhere).
inline const gemm_table*& accumulation_state() noexcept
{
    thread_local const gemm_table* table = nullptr;
    return table;
}

/// Selection for a lifetime, the previous one restored on destruction.
class accumulation_selection {
public:
    explicit accumulation_selection(const gemm_table* table) noexcept : m_table(accumulation_state(), table) {}

private:
    scalify::detail::scoped_setting<const gemm_table*> m_table;
};

/// The model tags accumulation_scope<Model> takes.
template <class Model>
inline constexpr bool scope_selectable = std::same_as<Model, exact_accumulation> || std::same_as<Model, h100_cublaslt_fp8> ||
                                         std::same_as<Model, h100_cublaslt_fp8_fast>;

/// The table of a model tag a scope can select at compile time (only that GPU's engines compile).
template <class Model>
[[nodiscard]] constexpr const gemm_table* static_table() noexcept
{
    static_assert(scope_selectable<Model>,
                  "accumulation_scope<Model> selects exact_accumulation, h100_cublaslt_fp8 or h100_cublaslt_fp8_fast; "
                  "select a GPU by accumulation_scope<>(accumulation::...) and pass other models to matmul per call");
    // The table's mode depends on Model: a table named by constants alone was instantiated (every
    // H100 engine) wherever this header was read, used or not.
    if constexpr (std::same_as<Model, exact_accumulation>) return nullptr;
    else return &gemm_table_of<std::same_as<Model, h100_cublaslt_fp8> ? accumulation::h100 : accumulation::h100_fast, false>;
}

}  // namespace detail

/// The enumerator of a model tag a scope can select.
template <AccumulationModel Model>
inline constexpr accumulation accumulation_of = [] {
    static_assert(detail::scope_selectable<Model>,
                  "an accumulation scope selects exact_accumulation, h100_cublaslt_fp8 or h100_cublaslt_fp8_fast; "
                  "pass other models to matmul per call");
    if constexpr (std::same_as<Model, h100_cublaslt_fp8>) return accumulation::h100;
    else if constexpr (std::same_as<Model, h100_cublaslt_fp8_fast>) return accumulation::h100_fast;
    else return accumulation::exact;
}();

/// The GPU matmul uses in this thread when a call names no model (exact outside any scope).
[[nodiscard]] inline accumulation current_accumulation() noexcept
{
    const gemm_table* table = detail::accumulation_state();
    return table ? table->choice.mode : accumulation::exact;
}

/// The whole choice: the GPU, and whether float32 products run as tf32.
[[nodiscard]] inline accumulation_choice current_accumulation_choice() noexcept
{
    const gemm_table* table = detail::accumulation_state();
    return table ? table->choice : accumulation_choice{};
}

/// The GEMM model an untagged matmul of operands of dtypes a and b runs in this thread ("exact"
/// where none): for messages and reports.
[[nodiscard]] inline std::string_view current_gemm_name(dtype a, dtype b) noexcept
{
    const gemm_table* table = detail::accumulation_state();
    const char* model = table ? (*table)(a, b).model : nullptr;
    return model ? model : exact_accumulation::name;
}

/// Marks "chosen at run time" in accumulation_scope<>.
struct runtime_choice {};

/// Selects Model for every untagged matmul in this thread while it lives; nestable, restored on
/// destruction (exceptions included). Threads started inside do not inherit it.
///     tensor_core::accumulation_scope<tensor_core::h100_cublaslt_fp8_fast> fast;
template <class Model = runtime_choice>
class accumulation_scope : detail::accumulation_selection {
public:
    accumulation_scope() noexcept : accumulation_selection(detail::static_table<Model>()) {}
};

/// The run-time form: accumulation_scope<> scope(accumulation::b200), scope({accumulation::a100,
/// true}) or scope("h100-fast"), scope("a100+tf32"). A partial specialisation, not a full one, so
/// that its constructor, which references every GPU's engines, is instantiated only in a program
/// that constructs it (as a full specialisation's, it cost every includer 0.5 s of clang's front end).
template <class Model>
    requires std::same_as<Model, runtime_choice>
class accumulation_scope<Model> : detail::accumulation_selection {
public:
    explicit accumulation_scope(accumulation_choice choice)
        : accumulation_selection(detail::gemm_table_for(checked(choice)))
    {
    }
    explicit accumulation_scope(accumulation mode) : accumulation_scope(accumulation_choice(mode)) {}
    /// Parses text first (config_error naming every choice for anything else; nothing changes).
    explicit accumulation_scope(std::string_view text) : accumulation_scope(parse_accumulation(text)) {}
    explicit accumulation_scope(const char* text) : accumulation_scope(std::string_view(text)) {}
    explicit accumulation_scope(const std::string& text) : accumulation_scope(std::string_view(text)) {}

private:
    static accumulation_choice checked(accumulation_choice choice)
    {
        if (choice.tf32 && !accumulation_has_tf32(choice.mode))
            SCALIFY_THROW(config_error(fmt::format("accumulation: {} has no tf32 unit", to_string(choice.mode))));
        return choice;
    }
};

accumulation_scope(accumulation_choice) -> accumulation_scope<>;
accumulation_scope(accumulation) -> accumulation_scope<>;
accumulation_scope(std::string_view) -> accumulation_scope<>;
accumulation_scope(const char*) -> accumulation_scope<>;
accumulation_scope(std::string) -> accumulation_scope<>;

}  // namespace scalify::tensor_core
