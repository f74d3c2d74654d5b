# Shared by demo.cmake and test.cmake (both run in script mode: cmake -P).
# Installs missing Debian packages when run as root, then configures and builds a tree.

get_filename_component(SCALIFY_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
cmake_host_system_information(RESULT SCALIFY_JOBS QUERY NUMBER_OF_LOGICAL_CORES)

# What each command needs (the demo builds in build/, the tests in build-test/ and
# build-sanitize/): the compiler, the libraries, zlib and the Fashion-MNIST
# data for the training example, Catch2 and Google Benchmark, which configuring the tests and
# benchmarks finds, Open MPI for the data-parallel runs (optional to CMake; docs/distributed.md)
# and OpenBLAS's OpenMP build under the training example's GEMMs (optional too).
# The tests add clang 14 with its sanitizer and libFuzzer runtimes, its OpenMP and its linker
# (the sanitizer tree).
set(SCALIFY_DEMO_PACKAGES
  g++ make libeigen3-dev libxtensor-dev libfmt-dev zlib1g-dev dataset-fashion-mnist catch2 libbenchmark-dev
  openmpi-bin libopenmpi-dev libopenblas-openmp-dev fortunes)
set(SCALIFY_TEST_PACKAGES ${SCALIFY_DEMO_PACKAGES} clang-14 libclang-rt-14-dev libomp-14-dev lld-14)
# The ARM64 cross tree (cmake/cross_test.cmake, build-arm64/): Debian's aarch64 cross compiler
# (with the arm64 libc, libstdc++ and libgomp it links against), qemu-user, the
# header-only libraries (the host's libxtensor-dev: libxtensor-dev:arm64 is not installable, its
# xtl-dev is not Multi-Arch: foreign), and from Debian's multiarch arm64 packages
# (dpkg --add-architecture arm64) the compiled ones, zlib (the training example) and fmt, and the
# run-time libraries qemu loads the programs with (libc6:arm64 comes with zlib1g-dev:arm64; see
# cmake/toolchains/aarch64-linux-gnu.cmake).
set(SCALIFY_CROSS_ARCHITECTURE arm64)
set(SCALIFY_CROSS_PACKAGES
  make g++-aarch64-linux-gnu qemu-user libeigen3-dev libxtensor-dev catch2 dataset-fashion-mnist fortunes
  libfmt-dev:arm64 zlib1g-dev:arm64 libstdc++6:arm64 libgomp1:arm64)

function(scalify_require_packages)
  find_program(dpkg_query dpkg-query)
  if(NOT dpkg_query)
    message(WARNING "scalify: dpkg-query not found, so installed packages cannot be checked; "
                    "make sure these are present: ${ARGN}")
    return()
  endif()
  set(missing "")
  foreach(pkg IN LISTS ARGN)
    execute_process(COMMAND ${dpkg_query} -W "-f=\${Status}" ${pkg}
                    OUTPUT_VARIABLE status ERROR_QUIET)
    if(NOT status MATCHES "install ok installed")
      list(APPEND missing ${pkg})
    endif()
  endforeach()
  if(NOT missing)
    return()
  endif()
  list(JOIN missing " " missing_line)
  execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT uid STREQUAL "0")
    message(FATAL_ERROR "scalify needs Debian packages that are not installed: ${missing_line}\n"
                        "Install them as root, then run this command again:\n"
                        "  sudo apt-get update && sudo apt-get install -y ${missing_line}")
  endif()
  message(STATUS "scalify: installing ${missing_line}")
  execute_process(COMMAND apt-get update COMMAND_ERROR_IS_FATAL ANY)
  execute_process(COMMAND env DEBIAN_FRONTEND=noninteractive
                          apt-get install -y --no-install-recommends ${missing}
                  COMMAND_ERROR_IS_FATAL ANY)
endfunction()

# scalify_require_architecture(<debian architecture>): makes dpkg take packages of that foreign
# architecture (multiarch), as root; otherwise stops with the command to run.
function(scalify_require_architecture arch)
  execute_process(COMMAND dpkg --print-architecture OUTPUT_VARIABLE native OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(WARNING "scalify: dpkg not found; make sure the ${arch} packages are installed")
    return()
  endif()
  execute_process(COMMAND dpkg --print-foreign-architectures OUTPUT_VARIABLE foreign)
  string(REGEX MATCHALL "[^\n]+" foreign "${foreign}")
  if(arch STREQUAL native OR arch IN_LIST foreign)
    return()
  endif()
  execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT uid STREQUAL "0")
    message(FATAL_ERROR "scalify needs Debian's ${arch} packages (multiarch). As root, run:\n"
                        "  sudo dpkg --add-architecture ${arch}\nthen this command again.")
  endif()
  message(STATUS "scalify: dpkg --add-architecture ${arch}")
  execute_process(COMMAND dpkg --add-architecture ${arch} COMMAND_ERROR_IS_FATAL ANY)
endfunction()

# scalify_build(<binary dir> [TARGETS <target>...] [ARGS <cache argument>...]): configure (cheap
# when nothing changed) and build the targets (all when none are named).
function(scalify_build binary_dir)
  cmake_parse_arguments(PARSE_ARGV 1 build "" "" "TARGETS;ARGS")
  set(targets "")
  if(build_TARGETS)
    set(targets --target ${build_TARGETS})
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${SCALIFY_ROOT}" -B "${binary_dir}" ${build_ARGS}
                  COMMAND_ERROR_IS_FATAL ANY)
  execute_process(COMMAND ${CMAKE_COMMAND} --build "${binary_dir}" --parallel ${SCALIFY_JOBS} ${targets}
                  COMMAND_ERROR_IS_FATAL ANY)
endfunction()

# The main tree, build/: optimised (Release), where the demo builds the examples as users run
# them; the benchmarks and tools a developer builds in the same tree (cmake --build build
# --target scalify_benchmarks) share its objects.
set(SCALIFY_MAIN_BUILD "${SCALIFY_ROOT}/build")
# The unit tests are built once, in the test command's sanitizer tree: not here.
set(SCALIFY_MAIN_ARGS -DCMAKE_BUILD_TYPE=Release -DSCALIFY_BUILD_UNIT_TESTS=OFF)

# The test command's g++ tree, build-test/: what ctest runs there, at -Og. The examples' checks
# need their output and exit status, not -O3's speed, and -Og compiles them in 205 CPU-s against
# 518 (g++ 12, AMD EPYC Zen 3) while their checks run 13 s against 9; the exhaustive sweeps keep
# -O3 and -march=native (tests/CMakeLists.txt), the code the demo's examples run.
set(SCALIFY_TEST_BUILD "${SCALIFY_ROOT}/build-test")
set(SCALIFY_TEST_ARGS -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-Og -DNDEBUG"
    -DSCALIFY_BUILD_UNIT_TESTS=OFF -DSCALIFY_BUILD_BENCHMARKS=OFF -DSCALIFY_BUILD_TOOLS=OFF)

# scalify_minutes(<out> <seconds>): "M min S s".
function(scalify_minutes out seconds)
  math(EXPR minutes "${seconds} / 60")
  math(EXPR rest "${seconds} % 60")
  set(${out} "${minutes} min ${rest} s" PARENT_SCOPE)
endfunction()

# scalify_phase(<name>): appends "<name>: M min S s" (the time since ${mark}) to ${phases} and
# moves the mark; the commands print the list at the end.
macro(scalify_phase name)
  string(TIMESTAMP now "%s")
  math(EXPR seconds "${now} - ${mark}")
  scalify_minutes(shown ${seconds})
  list(APPEND phases "${name}: ${shown}")
  set(mark ${now})
endmacro()
