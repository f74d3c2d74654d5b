# cmake -P cmake/test.cmake — set up, build and run the whole test suite, then the unit tests
cmake_minimum_required(VERSION 3.21)  # script mode: sets the policies, so no CMP warnings
# again under AddressSanitizer + UndefinedBehaviorSanitizer and the libFuzzer targets (built with
# clang++ 14, so every run also proves the code compiles warning-free with both g++ and clang++).
include("${CMAKE_CURRENT_LIST_DIR}/setup.cmake")

scalify_require_packages(${SCALIFY_DEBIAN_PACKAGES})

function(scalify_ctest binary_dir)
  execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --test-dir "${binary_dir}" --output-on-failure
                          --parallel ${SCALIFY_JOBS} ${ARGN}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ctest in ${binary_dir} failed (exit ${rc})")
  endif()
endfunction()

string(TIMESTAMP started "%s")
scalify_build("${SCALIFY_MAIN_BUILD}" ARGS ${SCALIFY_MAIN_ARGS})
scalify_ctest("${SCALIFY_MAIN_BUILD}")

# Only what runs there (the unit tests, the fuzz targets) and the static_assert files: the
# exhaustive sweeps, examples and tools ran in the main tree.
scalify_build("${SCALIFY_ROOT}/build-sanitize"
  TARGETS scalify_unit_tests scalify_fuzz_targets scalify_static_tests
  ARGS
  -DCMAKE_BUILD_TYPE=Debug
  -DCMAKE_CXX_COMPILER=clang++-14
  "-DCMAKE_CXX_FLAGS=-O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  -DSCALIFY_BUILD_EXAMPLES=OFF -DSCALIFY_BUILD_BENCHMARKS=OFF -DSCALIFY_BUILD_TOOLS=OFF -DSCALIFY_INSTALL=OFF
  -DSCALIFY_BUILD_FUZZ=ON)
# The whole unit suite under the sanitizers, then every fuzz target for SCALIFY_FUZZ_SECONDS.
scalify_ctest("${SCALIFY_ROOT}/build-sanitize" -L "unit|fuzz")

string(TIMESTAMP finished "%s")
math(EXPR seconds "${finished} - ${started}")
message("scalify: all tests passed (${seconds} s, including both builds)")
