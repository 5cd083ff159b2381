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

find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  find_path(FERRY_CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${FERRY_CLI11_INCLUDE_DIR})
endif()

# liburing is optional; without it the POSIX backend records why it uses pread.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(LIBURING IMPORTED_TARGET liburing)
endif()
