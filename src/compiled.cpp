// scalify::compiled: the kernels of detail/compiled_instances.hpp, compiled once for the programs
// that link this library (they see them declared `extern template` and reuse these copies).
#include <scalify/scalify.hpp>

SCALIFY_FOR_EACH_GEMM_MODEL(SCALIFY_TENSOR_CORE_INSTANCE, template)
SCALIFY_FOR_EACH_LANE_PLAN(SCALIFY_LANE_STEPS_INSTANCE, template)
SCALIFY_GEMM_ENGINE_INSTANCES(template)
SCALIFY_GEMM_SLAB_INSTANCES(template, float)
SCALIFY_GEMM_SLAB_INSTANCES(template, double)
SCALIFY_ACCUMULATION_TABLE_INSTANCE(template)
SCALIFY_CAST_INSTANCES(template)
