# cmake -P cmake/demo.cmake — set up, build and run the bundled examples, printing their results.
cmake_minimum_required(VERSION 3.21)  # script mode: sets the policies, so no CMP warnings
include("${CMAKE_CURRENT_LIST_DIR}/setup.cmake")

scalify_require_packages(${SCALIFY_DEBIAN_PACKAGES})
scalify_build("${SCALIFY_MAIN_BUILD}" ARGS ${SCALIFY_MAIN_ARGS})

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
message("\nAll examples ran. Sources are in examples/, results above.")
