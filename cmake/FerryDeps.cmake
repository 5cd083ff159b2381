# Third-party dependencies. Everything here comes from Debian packages (or the same headers on the
# GPU machine). CUDA is not needed to build: libcuda and libcufile are dlopen()ed at run time, and
# ferry declares the parts of their APIs it uses itself (src/cuda/cuda_abi.h,
# src/cufile/cufile_abi.h). Where NVIDIA's headers exist, one file each checks those declarations
# against them at compile time, and only those two files see the headers.
find_package(Threads REQUIRED)

find_path(FERRY_CUDA_INCLUDE_DIR cuda.h
  HINTS ${CUDAToolkit_ROOT} $ENV{CUDA_HOME} /usr/local/cuda
  PATH_SUFFIXES include targets/x86_64-linux/include)
if(FERRY_CUDA_INCLUDE_DIR)
  message(STATUS "cuda.h found in ${FERRY_CUDA_INCLUDE_DIR}: declarations will be checked")
else()
  message(STATUS "cuda.h not found: ferry's CUDA declarations go unchecked (none is needed)")
endif()

find_path(FERRY_CUFILE_INCLUDE_DIR cufile.h
  HINTS /usr/local/cuda/targets/x86_64-linux/include /usr/local/cuda/include)
if(FERRY_CUFILE_INCLUDE_DIR)
  message(STATUS "cufile.h found in ${FERRY_CUFILE_INCLUDE_DIR}: declarations will be checked")
endif()

# Header-only fallbacks: where a package's CMake files are missing (the GPU machine has some
# headers but not all packages), scripts/carry-deps copies Debian's headers into .carry/include.
set(FERRY_CARRY_INCLUDE ${PROJECT_SOURCE_DIR}/.carry/include)

find_package(nlohmann_json 3 QUIET)
if(NOT nlohmann_json_FOUND)
  find_path(FERRY_JSON_INCLUDE_DIR nlohmann/json.hpp HINTS ${FERRY_CARRY_INCLUDE} REQUIRED)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  target_include_directories(nlohmann_json::nlohmann_json INTERFACE ${FERRY_JSON_INCLUDE_DIR})
endif()

find_package(fmt QUIET)
if(NOT fmt_FOUND)
  find_path(FERRY_FMT_INCLUDE_DIR fmt/format.h HINTS ${FERRY_CARRY_INCLUDE} REQUIRED)
  add_library(fmt::fmt INTERFACE IMPORTED)
  target_include_directories(fmt::fmt INTERFACE ${FERRY_FMT_INCLUDE_DIR})
  target_compile_definitions(fmt::fmt INTERFACE FMT_HEADER_ONLY=1)
  message(STATUS "fmt: header-only from ${FERRY_FMT_INCLUDE_DIR}")
endif()

# The command-line tool's (and its tests') own dependencies.
if(FERRY_BUILD_TOOLS)
  find_package(CLI11 CONFIG QUIET)
  if(NOT CLI11_FOUND)
    find_path(FERRY_CLI11_INCLUDE_DIR CLI/CLI.hpp HINTS ${FERRY_CARRY_INCLUDE} REQUIRED)
    add_library(CLI11::CLI11 INTERFACE IMPORTED)
    target_include_directories(CLI11::CLI11 INTERFACE ${FERRY_CLI11_INCLUDE_DIR})
  endif()
endif()
if(FERRY_BUILD_TOOLS OR FERRY_BUILD_TESTS)
  find_package(OpenSSL REQUIRED COMPONENTS Crypto)
endif()

# liburing is optional; without it the POSIX backend records why it uses pread.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(LIBURING IMPORTED_TARGET liburing)
endif()
