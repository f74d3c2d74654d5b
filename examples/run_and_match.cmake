# Runs an example (through EMULATOR, a cross-compiled tree's runner, where given); fails unless it
# exits 0 and its output matches every regular expression in MATCH.
execute_process(COMMAND ${EMULATOR} "${EXECUTABLE}" ${ARGS} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXECUTABLE} exited with ${rc}")
endif()
foreach(pattern IN LISTS MATCH)
  if(NOT out MATCHES "${pattern}")
    message(FATAL_ERROR "output does not match '${pattern}'")
  endif()
endforeach()
