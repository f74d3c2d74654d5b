# cmake -DSOURCE=... -DBINARY=... -DARGS=... -P run_consumer.cmake: configure, build, run.
file(REMOVE_RECURSE "${BINARY}")
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE}" -B "${BINARY}" ${ARGS} COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND ${CMAKE_COMMAND} --build "${BINARY}" COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND "${BINARY}/consumer" OUTPUT_VARIABLE out COMMAND_ERROR_IS_FATAL ANY)
message("${out}")
if(NOT out MATCHES "e4m3fn\\(448\\) = 448, saturated 1000 -> 448")
  message(FATAL_ERROR "unexpected consumer output: ${out}")
endif()
