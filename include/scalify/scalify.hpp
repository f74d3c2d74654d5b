#pragma once
/// \file scalify.hpp
/// The one include of scalify: scaled tensor arithmetic for low-precision numerics.

#include <scalify/amp/any_scaled_array.hpp>
#include <scalify/amp/autocast.hpp>
#include <scalify/amp/decoupled.hpp>
#include <scalify/amp/policy.hpp>
#include <scalify/autodiff.hpp>
#include <scalify/block/block_ops.hpp>
#include <scalify/block/block_scaled_array.hpp>
#include <scalify/block/quantize.hpp>
#include <scalify/config.hpp>
#include <scalify/error.hpp>
#include <scalify/io/diagnostics.hpp>
#include <scalify/io/format.hpp>
#include <scalify/numeric/convert.hpp>
#include <scalify/numeric/eigen.hpp>
#include <scalify/numeric/format.hpp>
#include <scalify/numeric/limits.hpp>
#include <scalify/numeric/minifloat.hpp>
#include <scalify/numeric/policies.hpp>
#include <scalify/ops/elementwise.hpp>
#include <scalify/ops/matmul.hpp>
#include <scalify/ops/nn.hpp>
#include <scalify/ops/operators.hpp>
#include <scalify/ops/reduce.hpp>
#include <scalify/ops/result.hpp>
#include <scalify/ops/shape.hpp>
#include <scalify/scaled_array.hpp>
#include <scalify/strategy/amax_scaling.hpp>
#include <scalify/strategy/rescale.hpp>
#include <scalify/strategy/scaling.hpp>
#include <scalify/train/autoscale.hpp>
#include <scalify/train/backward.hpp>
#include <scalify/train/loss_scaler.hpp>
#include <scalify/train/sgd.hpp>
