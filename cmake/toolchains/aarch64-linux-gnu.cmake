# Cross-compiling for 64-bit Arm Linux (Graviton, Grace) with Debian's cross toolchain
# (g++-aarch64-linux-gnu). Tests and benchmarks run under qemu-user: CMake prefixes each test's
# command with the emulator, and -L points it at the target's libraries. tools/test-all's
# aarch64 step builds and runs it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(SMDDP_TARGET_ROOT /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH ${SMDDP_TARGET_ROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;${SMDDP_TARGET_ROOT})
# pkg-config reads the target's .pc files only, never the build machine's: without this the x86-64
# libfabric-dev was "found" (with its version) and then could not be linked for aarch64.
set(ENV{PKG_CONFIG_LIBDIR} "${SMDDP_TARGET_ROOT}/lib/pkgconfig:/usr/lib/aarch64-linux-gnu/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
