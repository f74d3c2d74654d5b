#pragma once
/// \file tensor_core.hpp
/// Hardware-faithful tensor cores: bit-exact CPU models of GPU and Intel AMX matrix instructions
/// and of the GEMMs built from them (scalify::tensor_core), and the accumulation model scalify's
/// matmul runs. docs/tensor_core.md has the rules, the match rates and examples.

#include <scalify/tensor_core/accumulation.hpp>
#include <scalify/tensor_core/amx.hpp>
#include <scalify/tensor_core/blackwell.hpp>
#include <scalify/tensor_core/cdna.hpp>
#include <scalify/tensor_core/dot.hpp>
#include <scalify/tensor_core/gemm.hpp>
#include <scalify/tensor_core/model.hpp>
