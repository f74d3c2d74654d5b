# cmake -P cmake/cross_test.cmake — cross-compile the tests for ARM64 (aarch64) with Debian's
# g++-aarch64-linux-gnu and run them under qemu-user (cmake/toolchains/aarch64-linux-gnu.cmake sets
# CMAKE_CROSSCOMPILING_EMULATOR, so ctest and catch_discover_tests run every program through it):
# the unit tests (label unit), the tour examples against their expected outputs (tour), the
# small char_lm training check and the conversion sweeps (exhaustive; under emulation every
# SCALIFY_CROSS_STRIDE-th float32 input). Not fashion_mnist's two one-epoch checks: 2.5 minutes
# each under qemu, where the test command runs them natively. Built in build-arm64/
# with the project's warning flags (-Werror), so a warning on ARM64 fails the build. As root it
# first makes dpkg take arm64 packages (multiarch) and installs what is missing
# (SCALIFY_CROSS_PACKAGES, cmake/setup.cmake); the end prints the build and run minutes.
cmake_minimum_required(VERSION 3.21)  # script mode: sets the policies, so no CMP warnings
include("${CMAKE_CURRENT_LIST_DIR}/setup.cmake")

scalify_require_architecture(${SCALIFY_CROSS_ARCHITECTURE})
scalify_require_packages(${SCALIFY_CROSS_PACKAGES})

if(NOT DEFINED ENV{OMP_WAIT_POLICY})  # as cmake/test.cmake: waiting OpenMP threads sleep
  set(ENV{OMP_WAIT_POLICY} passive)
endif()

# Every STRIDE-th input of each sweep: odd, so the inputs visited meet every residue modulo any
# power of two, and no more than 2^9, so the 2^32 / STRIDE of them meet every one of the 2^23
# mantissa patterns (and every exponent of both signs). See tests/exhaustive/test_exhaustive.cpp.
if(NOT DEFINED SCALIFY_CROSS_STRIDE)
  set(SCALIFY_CROSS_STRIDE 511)
endif()

set(cross_build "${SCALIFY_ROOT}/build-arm64")
string(TIMESTAMP started "%s")
set(mark ${started})

# The g++ tree's levels (cmake/setup.cmake): -Og, the sweeps -O3 (tests/CMakeLists.txt). No
# -march=native for a cross compiler (SCALIFY_NATIVE off; the sweeps and examples keep its
# -ffp-contract=off), no MPI, no OpenBLAS, nothing but what ctest runs here.
scalify_build("${cross_build}"
  TARGETS scalify_cross_tests
  ARGS
  "-DCMAKE_TOOLCHAIN_FILE=${SCALIFY_ROOT}/cmake/toolchains/aarch64-linux-gnu.cmake"
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-Og -DNDEBUG"
  -DSCALIFY_NATIVE=OFF -DSCALIFY_WITH_MPI=OFF -DSCALIFY_EXAMPLES_BLAS=OFF -DSCALIFY_USE_BLAS=OFF
  -DSCALIFY_BUILD_BENCHMARKS=OFF -DSCALIFY_BUILD_TOOLS=OFF -DSCALIFY_INSTALL=OFF
  "-DSCALIFY_EXHAUSTIVE_STRIDE=${SCALIFY_CROSS_STRIDE}")
scalify_phase("ARM64 cross build (build-arm64/, aarch64-linux-gnu-g++)")

execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --test-dir "${cross_build}" --output-on-failure
                        --parallel ${SCALIFY_JOBS} -L "unit|example|exhaustive" -E "fashion_mnist"
                RESULT_VARIABLE rc)
scalify_phase("ARM64 tests under qemu-aarch64")
if(NOT rc EQUAL 0)
  list(JOIN phases "\n  " shown_phases)
  message(FATAL_ERROR "ctest in ${cross_build} failed (exit ${rc}):\n  ${shown_phases}")
endif()

string(TIMESTAMP finished "%s")
math(EXPR seconds "${finished} - ${started}")
scalify_minutes(total ${seconds})
list(JOIN phases "\n  " shown_phases)
message("scalify: all ARM64 tests passed under qemu in ${total}, the build included (sweeps: every "
        "${SCALIFY_CROSS_STRIDE}th float32 input):\n  ${shown_phases}")
