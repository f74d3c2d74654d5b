# How the tests launch MPI ranks: ${SCALIFY_MPIEXEC_2} starts 2. Open MPI refuses more ranks than
# free cores without --oversubscribe (CI has 2 cores, and ctest runs another test beside) and
# refuses root without its two opt-in variables (CI runs as root); MPICH needs neither.
set(SCALIFY_MPI_OVERSUBSCRIBE OFF)
set(SCALIFY_MPI_ENVIRONMENT "")
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE launcher_version ERROR_VARIABLE launcher_version)
if(launcher_version MATCHES "Open MPI|OpenRTE")
  set(SCALIFY_MPI_OVERSUBSCRIBE ON)
  set(SCALIFY_MPI_ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()
set(SCALIFY_MPIEXEC_2 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2)
if(SCALIFY_MPI_OVERSUBSCRIBE)
  list(APPEND SCALIFY_MPIEXEC_2 --oversubscribe)
endif()
