# cmake -P cmake/test.cmake — set up, build and run the whole test suite: the g++ tree
# (build-test/ at -Og, the exhaustive sweeps at -O3 -march=native: the sweeps, examples and
# their checks, static, package and compile-fail tests, and the examples compiled for x86-64-v4,
# AVX-512, which this machine need not run), then the sanitizer tree (clang++ 14,
# AddressSanitizer + UndefinedBehaviorSanitizer, baseline x86-64: the unit tests, the libFuzzer
# targets, header hygiene and the tour examples' expected outputs once more, at a second ISA
# level), so every run also proves the code compiles warning-free with both g++ and clang++.
# Each tree builds only what its ctest runs, every target once (no benchmarks or tools), and the
# end prints the build and run minutes.
cmake_minimum_required(VERSION 3.21)  # script mode: sets the policies, so no CMP warnings
include("${CMAKE_CURRENT_LIST_DIR}/setup.cmake")

scalify_require_packages(${SCALIFY_TEST_PACKAGES})

# ctest runs two tests at once on a 2-core machine, and the OpenMP programs among them (the
# training checks, the unit tests of the threaded loops) would spin-wait for a core the other test
# holds: libgomp's default policy made a 1 s training check take 44 s. Waiting threads sleep.
if(NOT DEFINED ENV{OMP_WAIT_POLICY})
  set(ENV{OMP_WAIT_POLICY} passive)
endif()

function(scalify_ctest binary_dir)
  execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --test-dir "${binary_dir}" --output-on-failure
                          --parallel ${SCALIFY_JOBS} ${ARGN}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ctest in ${binary_dir} failed (exit ${rc})")
  endif()
endfunction()

string(TIMESTAMP started "%s")
set(mark ${started})

# AVX-512: a CPU the developers' and CI's machines may lack, whose Eigen kernels GCC 12 warned on.
# Each header compiled on its own: in the sanitizer tree, where it costs half (tests/CMakeLists.txt).
scalify_build("${SCALIFY_TEST_BUILD}" TARGETS scalify_tests
  ARGS ${SCALIFY_TEST_ARGS} -DSCALIFY_CHECK_ISA=x86-64-v4 -DSCALIFY_CHECK_HEADERS=OFF)
scalify_phase("g++ tree build (build-test/)")
scalify_ctest("${SCALIFY_TEST_BUILD}")
scalify_phase("g++ tree tests")

# Only what runs there (the unit tests, the fuzz targets, the header checks, the tour examples)
# and the static_assert files: the exhaustive sweeps and training examples ran in the g++ tree.
# The tour examples run here built for the baseline x86-64 (SSE2, no FMA: SCALIFY_NATIVE off)
# where the g++ tree built them for this machine, so an output that depends on the CPU's GEMM
# kernels fails on the developers' machine before it fails on a user's. -O0 compiles the instrumented unit tests
# several times faster than -O1 (test_autoscale_ad: 53 against 302 s); the fuzz targets keep -O1,
# their executions per second (fuzz_ops: 5000/s, 580/s at -O0).
# lld links the instrumented programs in a fraction of GNU ld's time (the unit tests: 1.3 s
# against 9.3, each fuzz target 0.4 against 2.1), at the end of the build where one core waits.
find_program(SCALIFY_LLD NAMES ld.lld-14 ld.lld)
set(sanitizer_link_flags "")
if(SCALIFY_LLD)
  set(sanitizer_link_flags "-DCMAKE_EXE_LINKER_FLAGS=--ld-path=${SCALIFY_LLD}")
endif()
scalify_build("${SCALIFY_ROOT}/build-sanitize"
  TARGETS scalify_sanitizer_tests
  ARGS
  ${sanitizer_link_flags}
  -DCMAKE_BUILD_TYPE=Debug
  # No debug information: it was 14-21 % of this tree's compile time. Reports still name the
  # function of every frame, and UBSan's their file:line; for ASan's file:line, reconfigure with
  # -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only and rebuild.
  -DCMAKE_CXX_FLAGS_DEBUG=
  -DCMAKE_CXX_COMPILER=clang++-14
  # Stack-use-after-return: clang 14's ASan runtime leaves it off (detect_stack_use_after_return
  # is false unless ASAN_OPTIONS sets it), so its instrumentation only cost compile time: the
  # -O0 unit tests' numerics source 75 -> 63 s and ops 53-58 -> 45-46 without it, autodiff
  # unchanged (111, 113), the -O1 fuzz source 200 -> 194 (each pair compiled side by side).
  # The `sanitize` preset (CMakePresets.json) keeps it: run that tree with that option set.
  "-DCMAKE_CXX_FLAGS=-O0 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -fsanitize-address-use-after-return=never"
  -DSCALIFY_BUILD_EXAMPLES=ON -DSCALIFY_NATIVE=OFF -DSCALIFY_BUILD_BENCHMARKS=OFF -DSCALIFY_BUILD_TOOLS=OFF
  -DSCALIFY_INSTALL=OFF -DSCALIFY_BUILD_FUZZ=ON)
scalify_phase("sanitizer tree build (build-sanitize/, clang++ 14)")
# The whole unit suite under the sanitizers, every fuzz target for SCALIFY_FUZZ_SECONDS, the
# header checks and the tour examples against their expected outputs.
scalify_ctest("${SCALIFY_ROOT}/build-sanitize" -L "unit|fuzz|tour|headers")
scalify_phase("sanitizer tree tests")

string(TIMESTAMP finished "%s")
math(EXPR seconds "${finished} - ${started}")
scalify_minutes(total ${seconds})
list(JOIN phases "\n  " shown_phases)
message("scalify: all tests passed in ${total}, both builds included:\n  ${shown_phases}")
