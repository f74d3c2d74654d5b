# cmake -P cmake/demo.cmake — set up, build and run the bundled examples, printing their results.
# It builds the examples and nothing else (target scalify_examples in build/, compiled for this
# machine's CPU: SCALIFY_NATIVE); the tests, benchmarks and tools are built by the commands that
# use them.
cmake_minimum_required(VERSION 3.21)  # script mode: sets the policies, so no CMP warnings
include("${CMAKE_CURRENT_LIST_DIR}/setup.cmake")

scalify_require_packages(${SCALIFY_DEMO_PACKAGES})
string(TIMESTAMP mark "%s")
scalify_build("${SCALIFY_MAIN_BUILD}" TARGETS scalify_examples ARGS ${SCALIFY_MAIN_ARGS})
scalify_phase(build)

# examples/CMakeLists.txt writes one line per example: <name>|<executable>|<arguments;...>
file(STRINGS "${SCALIFY_MAIN_BUILD}/examples/demo_commands.txt" demo_lines)
foreach(line IN LISTS demo_lines)
  string(REPLACE "|" ";" fields "${line}")
  list(POP_FRONT fields name executable)
  string(REPLACE "," ";" arguments "${fields}")
  string(REPLACE ";" " " shown "${arguments}")
  message("\n==== ${name} ${shown}")
  execute_process(COMMAND "${executable}" ${arguments} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "example ${name} failed (exit ${rc})")
  endif()
endforeach()
scalify_phase(run)
list(JOIN phases ", " shown_phases)
message("\nAll examples ran (${shown_phases}). Sources are in examples/, results above.")
