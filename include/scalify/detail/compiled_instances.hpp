#pragma once
/// \file detail/compiled_instances.hpp
/// The heavy kernels that the optional scalify::compiled library (src/compiled.cpp) compiles
/// once: the tensor-core GEMM engines of every GEMM model (and the table of every GPU's GEMMs a
/// run-time accumulation scope selects from), Eigen's GEMM behind every float and double matmul,
/// and the common casts. With SCALIFY_SEPARATE_COMPILATION defined (linking scalify::compiled defines
/// it) the headers declare them `extern template`, so a program's translation units reuse the
/// library's copies instead of compiling their own: a 2-layer MLP training program's TU in 8.8
/// CPU-s against 12.3, 539 MB against 747 (docs/benchmarks.md, "Compile time").
/// A GEMM model added to tensor_core/model.hpp joins SCALIFY_FOR_EACH_GEMM_MODEL.

#include <cstddef>
#include <cstdint>

/// X(KIND, Model) for every GEMM model.
#define SCALIFY_FOR_EACH_GEMM_MODEL(X, KIND)                 \
    X(KIND, scalify::tensor_core::h100_cublaslt_fp8)      \
    X(KIND, scalify::tensor_core::h100_cublaslt_fp8_fast) \
    X(KIND, scalify::tensor_core::h100_hmma_chain)        \
    X(KIND, scalify::tensor_core::v100_hmma_chain)        \
    X(KIND, scalify::tensor_core::a100_hmma_chain)        \
    X(KIND, scalify::tensor_core::ada_hmma_chain)         \
    X(KIND, scalify::tensor_core::ada_qmma_chain)         \
    X(KIND, scalify::tensor_core::b200_hmma_chain)        \
    X(KIND, scalify::tensor_core::b200_qmma_chain)        \
    X(KIND, scalify::tensor_core::a100_tf32_chain)        \
    X(KIND, scalify::tensor_core::ada_tf32_chain)         \
    X(KIND, scalify::tensor_core::h100_tf32_chain)        \
    X(KIND, scalify::tensor_core::b200_tf32_chain)

/// One instruction per plan of the lanes' steps (tensor_core/gemm.hpp, lane_steps_plan) among
/// those models' instructions: instructions that differ in F alone share their steps (a100_tf32
/// and ada_tf32 v100_hmma's; ada_hmma, h100_tf32 and b200_tf32 a100_hmma's; b200_hmma
/// h100_hmma's; gemm.hpp asserts it), and a model and its _fast form their instruction's.
#define SCALIFY_FOR_EACH_LANE_PLAN(X, KIND)   \
    X(KIND, scalify::tensor_core::h100_qgmma) \
    X(KIND, scalify::tensor_core::h100_hmma)  \
    X(KIND, scalify::tensor_core::v100_hmma)  \
    X(KIND, scalify::tensor_core::a100_hmma)  \
    X(KIND, scalify::tensor_core::ada_qmma)   \
    X(KIND, scalify::tensor_core::b200_qmma)

/// KIND is `template` (the definitions, in src/compiled.cpp) or `extern template`. A model's own
/// code: its reference chain; the engines' bodies it runs through are SCALIFY_GEMM_ENGINE_INSTANCES.
#define SCALIFY_TENSOR_CORE_INSTANCE(KIND, Model)                                   \
    KIND float ::scalify::tensor_core::detail::chain_reference<Model>(              \
        const ::scalify::tensor_core::detail::operand*, const ::scalify::tensor_core::detail::operand*, std::size_t) noexcept;

#define SCALIFY_LANE_STEPS_INSTANCE(KIND, Instruction)                                                                  \
    KIND void ::scalify::tensor_core::detail::lane_steps<::scalify::tensor_core::detail::lane_plan<Instruction>::steps>( \
        int, const float*, const std::int16_t*, std::size_t, const float*, const std::int16_t*, std::size_t, float*,    \
        std::size_t, std::size_t, const ::scalify::tensor_core::detail::uncut_terms&, bool, std::size_t);

/// The reference engine's and the lanes' GEMM bodies, one copy for every model.
#define SCALIFY_GEMM_ENGINE_INSTANCES(KIND)                                                                              \
    KIND void ::scalify::tensor_core::detail::gemm_reference_with<void>(                                              \
        ::scalify::tensor_core::detail::chain_fn, ::scalify::tensor_core::detail::operand_source,                      \
        ::scalify::tensor_core::detail::operand_source, std::size_t, std::size_t, std::size_t, float*);                \
    KIND bool ::scalify::tensor_core::detail::gemm_lanes_with<void>(                                                  \
        const ::scalify::tensor_core::detail::lane_model&, ::scalify::tensor_core::detail::gemm_operand,               \
        ::scalify::tensor_core::detail::gemm_operand, bool, std::size_t, std::size_t, std::size_t, float*);

/// The table a run-time tensor_core::accumulation_scope selects from (tensor_core/accumulation.hpp):
/// the one function that references every GPU's GEMMs over float32 operands on formats' grids,
/// AMX's included. Held here, a program's translation units compile no GEMM engine for it.
#define SCALIFY_ACCUMULATION_TABLE_INSTANCE(KIND)                                                      \
    KIND const ::scalify::tensor_core::gemm_table* ::scalify::tensor_core::detail::gemm_table_for<void>( \
        ::scalify::tensor_core::accumulation_choice) noexcept;

/// cast<U, nearest even, Saturation>(ScaledArray<T, P>): the widening casts to float (and double)
/// and the narrowing ones from float that the ops, the autodiff layer and the recipe run.
#define SCALIFY_CAST_INSTANCE(KIND, U, S, T, P) \
    KIND scalify::ScaledArray<U, P> scalify::cast<U, scalify::round_nearest_even, S, T, P>(const scalify::ScaledArray<T, P>&);

#define SCALIFY_CAST_INSTANCES_FOR_POLICY(KIND, P)                                                \
    SCALIFY_CAST_INSTANCE(KIND, float, scalify::no_saturation, float, P)                        \
    SCALIFY_CAST_INSTANCE(KIND, float, scalify::no_saturation, double, P)                       \
    SCALIFY_CAST_INSTANCE(KIND, float, scalify::no_saturation, Eigen::half, P)                  \
    SCALIFY_CAST_INSTANCE(KIND, float, scalify::no_saturation, Eigen::bfloat16, P)              \
    SCALIFY_CAST_INSTANCE(KIND, float, scalify::no_saturation, scalify::float8_e4m3fn, P)       \
    SCALIFY_CAST_INSTANCE(KIND, float, scalify::no_saturation, scalify::float8_e5m2, P)         \
    SCALIFY_CAST_INSTANCE(KIND, double, scalify::no_saturation, float, P)                       \
    SCALIFY_CAST_INSTANCE(KIND, double, scalify::no_saturation, double, P)                      \
    SCALIFY_CAST_INSTANCE(KIND, float, scalify::saturate_finite, float, P)                      \
    SCALIFY_CAST_INSTANCE(KIND, Eigen::half, scalify::no_saturation, float, P)                  \
    SCALIFY_CAST_INSTANCE(KIND, Eigen::half, scalify::saturate_finite, float, P)                \
    SCALIFY_CAST_INSTANCE(KIND, Eigen::bfloat16, scalify::no_saturation, float, P)              \
    SCALIFY_CAST_INSTANCE(KIND, Eigen::bfloat16, scalify::saturate_finite, float, P)            \
    SCALIFY_CAST_INSTANCE(KIND, scalify::float8_e4m3fn, scalify::no_saturation, float, P)       \
    SCALIFY_CAST_INSTANCE(KIND, scalify::float8_e4m3fn, scalify::saturate_finite, float, P)     \
    SCALIFY_CAST_INSTANCE(KIND, scalify::float8_e5m2, scalify::no_saturation, float, P)         \
    SCALIFY_CAST_INSTANCE(KIND, scalify::float8_e5m2, scalify::saturate_finite, float, P)

#define SCALIFY_CAST_INSTANCES(KIND)                              \
    SCALIFY_CAST_INSTANCES_FOR_POLICY(KIND, scalify::float_scale) \
    SCALIFY_CAST_INSTANCES_FOR_POLICY(KIND, scalify::pow2_scale)

#define SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, TransposeA, TransposeB)                                                  \
    KIND void ::scalify::detail::gemm_slab<C, TransposeA, TransposeB>(const C*, std::size_t, const C*, std::size_t, \
                                                                      C*, std::size_t, std::size_t, std::size_t,   \
                                                                      std::size_t, C, bool);

#define SCALIFY_GEMM_SLAB_INSTANCES(KIND, C)             \
    SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, false, false)    \
    SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, false, true)     \
    SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, true, false)     \
    SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, true, true)
