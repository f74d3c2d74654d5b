# cmake -DEXPECTED_FROM=<program> -DEXECUTABLE=<program> -P same_output.cmake: both run, and
# print the same standard output (and exit 0).
execute_process(COMMAND "${EXPECTED_FROM}" OUTPUT_VARIABLE expected RESULT_VARIABLE rc_expected)
execute_process(COMMAND "${EXECUTABLE}" OUTPUT_VARIABLE actual RESULT_VARIABLE rc_actual)
if(NOT rc_expected EQUAL 0 OR NOT rc_actual EQUAL 0)
  message(FATAL_ERROR "exit codes ${rc_expected} (${EXPECTED_FROM}) and ${rc_actual} (${EXECUTABLE})")
endif()
if(NOT expected STREQUAL actual)
  message(FATAL_ERROR "${EXECUTABLE} printed\n${actual}\nwhere ${EXPECTED_FROM} printed\n${expected}")
endif()
message("${actual}")
