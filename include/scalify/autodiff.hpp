#pragma once
/// \file autodiff.hpp
/// Reverse-mode autodiff over the scaled primitives (namespace scalify::ad): ad::var, ad::tape,
/// the differentiable ops and operators, gradient-path ops, value_and_grad / grad over parameter
/// trees, the matmul precision recipe, ad::inspect (a report of one step), SGD and Adam (AdamW). See
/// docs/autodiff.md and docs/inspect.md.

#include <scalify/autodiff/grad.hpp>
#include <scalify/autodiff/gradient.hpp>
#include <scalify/autodiff/inspect.hpp>
#include <scalify/autodiff/ops.hpp>
#include <scalify/autodiff/recipe.hpp>
#include <scalify/autodiff/tape.hpp>
#include <scalify/ops/operators.hpp>
#include <scalify/train/sgd.hpp>
#include <scalify/train/adam.hpp>
