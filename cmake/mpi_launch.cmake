# How the tests launch 2 MPI ranks. Open MPI refuses more ranks than cores without
# --oversubscribe (CI has 2 cores, and ctest runs another test beside) and refuses root without
# its two opt-in variables (CI runs as root); MPICH needs neither.
set(SCALIFY_MPIEXEC_2 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2)
set(SCALIFY_MPI_ENVIRONMENT "")
if(MPI_CXX_LIBRARY_VERSION_STRING MATCHES "Open MPI")
  list(APPEND SCALIFY_MPIEXEC_2 --oversubscribe)
  set(SCALIFY_MPI_ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endif()
