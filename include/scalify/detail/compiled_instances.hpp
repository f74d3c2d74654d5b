#pragma once
/// \file detail/compiled_instances.hpp
/// The heavy kernels that the optional scalify::compiled library (src/compiled.cpp) compiles
/// once: the tensor-core GEMM engines of every GEMM model and Eigen's GEMM behind every float and
/// double matmul. With SCALIFY_SEPARATE_COMPILATION defined (linking scalify::compiled defines
/// it) the headers declare them `extern template`, so a program's translation units reuse the
/// library's copies instead of compiling their own: measured on a 2-layer MLP training program,
/// 27 % less compile time and 25 % less peak memory (docs/benchmarks.md, "Compile time").
/// A GEMM model added to tensor_core/model.hpp joins SCALIFY_FOR_EACH_GEMM_MODEL.

#include <cstddef>
#include <cstdint>

/// X(KIND, Model) for every GEMM model.
#define SCALIFY_FOR_EACH_GEMM_MODEL(X, KIND)                 \
    X(KIND, scalify::tensor_core::h100_cublaslt_fp8)      \
    X(KIND, scalify::tensor_core::h100_cublaslt_fp8_fast) \
    X(KIND, scalify::tensor_core::h100_hmma_chain)

/// KIND is `template` (the definitions, in src/compiled.cpp) or `extern template`.
#define SCALIFY_TENSOR_CORE_INSTANCE(KIND, Model)                                                                   \
    KIND void ::scalify::tensor_core::detail::gemm_reference<Model>(                                                \
        ::scalify::tensor_core::detail::operand_source, ::scalify::tensor_core::detail::operand_source, std::size_t, \
        std::size_t, std::size_t, float*);                                                                          \
    KIND void ::scalify::tensor_core::detail::lane_chain<Model>(const float*, const std::int16_t*, const float*,     \
                                                               const std::int16_t*, std::size_t, float*, std::size_t); \
    KIND bool ::scalify::tensor_core::detail::gemm_lanes<Model>(::scalify::tensor_core::detail::gemm_operand,        \
                                                               ::scalify::tensor_core::detail::gemm_operand, bool,   \
                                                               std::size_t, std::size_t, std::size_t, float*);

#define SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, TransposeA, TransposeB)                                                  \
    KIND void ::scalify::detail::gemm_slab<C, TransposeA, TransposeB>(const C*, std::size_t, const C*, std::size_t, \
                                                                      C*, std::size_t, std::size_t, std::size_t,   \
                                                                      std::size_t, C);

#define SCALIFY_GEMM_SLAB_INSTANCES(KIND, C)             \
    SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, false, false)    \
    SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, false, true)     \
    SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, true, false)     \
    SCALIFY_GEMM_SLAB_INSTANCE(KIND, C, true, true)
