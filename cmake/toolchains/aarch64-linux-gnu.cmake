# ARM64 (aarch64) Linux with Debian's cross compiler (g++-aarch64-linux-gnu), the programs run
# under qemu-user: cmake/cross_test.cmake configures build-arm64/ with this file. The libraries the
# build links (zlib, fmt) and fmt's CMake package come from Debian's
# multiarch arm64 packages in /usr/lib/aarch64-linux-gnu (the set-up command installs them); the
# header-only ones (Eigen, Catch2, xtl, xtensor) are the host's.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# find_package / find_library look in /usr/lib/aarch64-linux-gnu, never the host's x86-64 one.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# ctest, catch_discover_tests (at build time) and the examples' checks run every program through
# qemu-user. Its loader and libraries are Debian's multiarch arm64 ones (/lib/ld-linux-aarch64.so.1,
# /usr/lib/aarch64-linux-gnu: libc6, libstdc++6, libgomp1, libfmt9, zlib1g :arm64), one consistent
# set. Not `-L /usr/aarch64-linux-gnu` (the cross toolchain's libc6-arm64-cross, which the build
# links against): with libc6:arm64 also installed, that loader falls back to the multiarch
# libc.so.6 of another build (2.36-8cross1 against 2.36-9+deb12u14), and every program that starts
# a thread (std::thread, OpenMP) hangs before its first clone().
find_program(SCALIFY_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(NOT SCALIFY_QEMU_AARCH64)
  message(FATAL_ERROR "qemu-aarch64 not found (Debian: apt-get install qemu-user)")
endif()
set(CMAKE_CROSSCOMPILING_EMULATOR "${SCALIFY_QEMU_AARCH64}")

# xtensor is header-only, and its CMake package the same on every architecture, but Debian ships it
# in the host's multiarch directory only (libxtensor-dev:arm64 is not installable: its xtl-dev is
# not Multi-Arch: foreign): use the host's.
if(NOT DEFINED xtensor_DIR)
  file(GLOB SCALIFY_HOST_XTENSOR_DIR LIST_DIRECTORIES true "/usr/lib/${CMAKE_HOST_SYSTEM_PROCESSOR}-linux-gnu/cmake/xtensor")
  if(SCALIFY_HOST_XTENSOR_DIR)
    set(xtensor_DIR "${SCALIFY_HOST_XTENSOR_DIR}" CACHE PATH "xtensor's CMake package (the host's; header-only)")
  endif()
endif()
