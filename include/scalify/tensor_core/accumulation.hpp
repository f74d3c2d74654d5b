#pragma once
/// \file tensor_core/accumulation.hpp
/// Which accumulation scalify's matmul runs: exact_accumulation (float32, Eigen's GEMM, the
/// default) or a GEMM model (h100_cublaslt_fp8, h100_cublaslt_fp8_fast). Chosen per call by a
/// tag, or for a region of code by a thread-local, nestable scope that every matmul without a
/// tag consults (matmul_vjp, the autodiff layer and model code included), restored on scope exit,
/// exceptions included:
///
///     auto y = matmul(x, w, tensor_core::h100_cublaslt_fp8_fast{});     // this call
///     {
///         tensor_core::accumulation_scope<tensor_core::h100_cublaslt_fp8> h100;   // this region
///         train_step(...);                                               // forward and backward
///     }
///     tensor_core::accumulation_scope<> chosen(flag);   // run-time: "exact", "h100", "h100-fast"
///
/// A model applies to the operand pairs it covers (operand_gemm below); other pairs keep exact
/// float32 accumulation.

#include <scalify/error.hpp>
#include <scalify/tensor_core/model.hpp>

#include <fmt/format.h>

#include <concepts>
#include <string>
#include <string_view>
#include <type_traits>

namespace scalify::tensor_core {

/// float32 accumulation as the CPU does it (Eigen's GEMM: float multiply-adds rounded to nearest
/// even), matmul's default. Not bit-exact to any GPU; docs/tensor_core.md compares it.
struct exact_accumulation {
    static constexpr const char* name = "exact";
};

/// What a matmul may accumulate with: exact_accumulation or a GEMM model.
template <class M>
concept AccumulationModel = std::same_as<M, exact_accumulation> || GemmModel<M>;

/// The GEMM model a matmul of TA x TB data runs under accumulation model Model, or void for
/// exact float32: Model itself where its instruction takes the pair; under the two H100 FP8
/// models, f16 x f16 and bf16 x bf16 run an HMMA chain (h100_hmma_chain: fast accumulation is an
/// FP8 setting, and cuBLAS's 16-bit GEMMs keep a float32 accumulator per chain); every other pair
/// (float, double, other minifloats, mixed widths) stays exact. Specialise it for other models.
template <AccumulationModel Model, class TA, class TB>
struct operand_gemm {
    using type = std::conditional_t<GemmModelFor<Model, TA, TB>, Model, void>;
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
// The run-time choice

/// The accumulation models a scope can select (a closed set: matmul dispatches over it).
enum class accumulation {
    exact,     ///< exact_accumulation
    h100,      ///< h100_cublaslt_fp8 (cuBLASLt default: promotion every 128 of K)
    h100_fast  ///< h100_cublaslt_fp8_fast (use_fast_accum=True: one chain)
};

/// The command-line spelling: "exact", "h100", "h100-fast".
[[nodiscard]] constexpr std::string_view to_string(accumulation mode) noexcept
{
    switch (mode) {
    case accumulation::h100: return "h100";
    case accumulation::h100_fast: return "h100-fast";
    case accumulation::exact: break;
    }
    return "exact";
}

/// "exact", "h100" or "h100-fast" (as to_string writes them); config_error naming the text
/// otherwise.
[[nodiscard]] inline accumulation parse_accumulation(std::string_view text)
{
    for (const accumulation mode : {accumulation::exact, accumulation::h100, accumulation::h100_fast}) {
        if (text == to_string(mode)) return mode;
    }
    SCALIFY_THROW(config_error(fmt::format("accumulation '{}' is not one of exact, h100, h100-fast", text)));
}

/// The enumerator of a model tag a scope can select.
template <AccumulationModel Model>
inline constexpr accumulation accumulation_of = [] {
    static_assert(std::same_as<Model, exact_accumulation> || std::same_as<Model, h100_cublaslt_fp8> ||
                      std::same_as<Model, h100_cublaslt_fp8_fast>,
                  "an accumulation scope selects exact_accumulation, h100_cublaslt_fp8 or h100_cublaslt_fp8_fast; "
                  "pass other models to matmul per call");
    if constexpr (std::same_as<Model, h100_cublaslt_fp8>) return accumulation::h100;
    else if constexpr (std::same_as<Model, h100_cublaslt_fp8_fast>) return accumulation::h100_fast;
    else return accumulation::exact;
}();

namespace detail {
inline accumulation& accumulation_state() noexcept
{
    thread_local accumulation mode = accumulation::exact;
    return mode;
}
/// Selection for a lifetime, the previous one restored on destruction.
class accumulation_selection {
public:
    explicit accumulation_selection(accumulation mode) noexcept : m_previous(accumulation_state())
    {
        accumulation_state() = mode;
    }
    ~accumulation_selection() { accumulation_state() = m_previous; }
    accumulation_selection(const accumulation_selection&) = delete;
    accumulation_selection& operator=(const accumulation_selection&) = delete;

private:
    accumulation m_previous;
};
}  // namespace detail

/// The model matmul uses in this thread when a call names none (exact outside any scope).
[[nodiscard]] inline accumulation current_accumulation() noexcept { return detail::accumulation_state(); }

/// Marks "chosen at run time" in accumulation_scope<>.
struct runtime_choice {};

/// Selects Model for every untagged matmul in this thread while it lives; nestable, restored on
/// destruction (exceptions included). Threads started inside do not inherit it.
///     tensor_core::accumulation_scope<tensor_core::h100_cublaslt_fp8_fast> fast;
template <class Model = runtime_choice>
class accumulation_scope : detail::accumulation_selection {
public:
    accumulation_scope() noexcept : accumulation_selection(accumulation_of<Model>) {}
};

/// The run-time form: accumulation_scope<> scope(accumulation::h100) or scope("h100-fast").
template <>
class accumulation_scope<runtime_choice> : detail::accumulation_selection {
public:
    explicit accumulation_scope(accumulation mode) noexcept : accumulation_selection(mode) {}
    /// Parses text first (config_error for anything but exact, h100, h100-fast; nothing changes).
    explicit accumulation_scope(std::string_view text) : accumulation_selection(parse_accumulation(text)) {}
    explicit accumulation_scope(const char* text) : accumulation_scope(std::string_view(text)) {}
    explicit accumulation_scope(const std::string& text) : accumulation_scope(std::string_view(text)) {}
};

accumulation_scope(accumulation) -> accumulation_scope<>;
accumulation_scope(std::string_view) -> accumulation_scope<>;
accumulation_scope(const char*) -> accumulation_scope<>;
accumulation_scope(std::string) -> accumulation_scope<>;

}  // namespace scalify::tensor_core
