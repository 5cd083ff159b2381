# Third-party dependencies. Everything here comes from Debian packages (or the same headers on the
# GPU machine). CUDA contributes headers only: libcuda and libcufile are dlopen()ed at run time.
find_package(Threads REQUIRED)

find_path(FERRY_CUDA_INCLUDE_DIR cuda.h
  HINTS ${CUDAToolkit_ROOT} $ENV{CUDA_HOME} /usr/local/cuda
  PATH_SUFFIXES include targets/x86_64-linux/include)
if(NOT FERRY_CUDA_INCLUDE_DIR)
  message(FATAL_ERROR "cuda.h not found: install the CUDA toolkit headers or set CUDAToolkit_ROOT")
endif()
add_library(ferry_cuda_headers INTERFACE)
target_include_directories(ferry_cuda_headers SYSTEM INTERFACE ${FERRY_CUDA_INCLUDE_DIR})

# cufile.h is optional: where it exists, ferry checks its own declarations against it.
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

find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  find_path(FERRY_CLI11_INCLUDE_DIR CLI/CLI.hpp HINTS ${FERRY_CARRY_INCLUDE} REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${FERRY_CLI11_INCLUDE_DIR})
endif()

find_package(OpenSSL REQUIRED COMPONENTS Crypto)

# liburing is optional; without it the POSIX backend records why it uses pread.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(LIBURING IMPORTED_TARGET liburing)
endif()
