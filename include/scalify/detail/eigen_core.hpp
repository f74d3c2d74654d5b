#pragma once
/// \file eigen_core.hpp
/// <Eigen/Core>, as every scalify header includes it.
///
/// GCC 12 (bug 105593, fixed in 12.3 and 13.1) reports its own AVX-512 intrinsics as using an
/// uninitialised variable: `_mm512_undefined_ps()` and its kin are written `__m512 __Y = __Y;`,
/// and Eigen's AVX-512 packet code (ptranspose, pbroadcast4, the GEMM kernels) inlines them. Built
/// with -march=x86-64-v4 or -march=native on an AVX-512 CPU and -Wall, every program whose Eigen
/// products scalify instantiates printed 85-117 such warnings (-Wuninitialized at -Og,
/// -Wmaybe-uninitialized at -O2), fatal under -Werror. GCC 12 honours a diagnostic pragma at any
/// location of a warning's inline stack, so ignoring the two around Eigen's own declarations
/// silences exactly the code inlined through Eigen and leaves both warnings on for scalify's code
/// and the user's. A program that includes Eigen before scalify compiles Eigen outside this
/// region: README ("Supported compilers and CPUs") names the flag for that case.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
#else
#include <Eigen/Core>
#endif
