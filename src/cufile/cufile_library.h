// libcufile, loaded at run time: ferry never links against it. This is the only place it is
// dlopen()ed. The table is loaded once per process and immutable afterwards, so it may be used
// from any thread; the library stays loaded until the process exits.
#pragma once

#include <string>
#include <vector>

#include "cufile/cufile_abi.h"

namespace ferry::cufile {

// One pointer per entry point ferry uses. The data path ones are required; the others are
// optional and null when the library lacks them (an old cuFile), which disables what needs them.
struct Library {
  std::string path;  // as passed to dlopen
  // Required.
  abi::DriverOpenFn DriverOpen = nullptr;
  abi::DriverCloseFn DriverClose = nullptr;  // cuFileDriverClose_v2, else cuFileDriverClose
  abi::HandleRegisterFn HandleRegister = nullptr;
  abi::HandleDeregisterFn HandleDeregister = nullptr;
  abi::BufRegisterFn BufRegister = nullptr;
  abi::BufDeregisterFn BufDeregister = nullptr;
  abi::ReadFn Read = nullptr;
  abi::WriteFn Write = nullptr;
  // Optional.
  abi::GetVersionFn GetVersion = nullptr;
  abi::SetParameterBoolFn SetParameterBool = nullptr;
  abi::SetStatsLevelFn SetStatsLevel = nullptr;
  abi::StatsStartFn StatsStart = nullptr;
  abi::GetStatsL3Fn GetStatsL3 = nullptr;
  std::vector<std::string> missing_optional;
};

struct LoadResult {
  const Library* library = nullptr;  // null when unusable
  std::string path;
  std::string why_not;  // "libcufile.so.0 not found", "... lacks symbols: cuFileRead"
  std::vector<std::string> missing_required;
};

// Loads once, on first call. FERRY_CUFILE_LIBRARY overrides the library path (tests point it at
// the test double or at a library that does not exist).
const LoadResult& load();

// "error 5027 (file descriptor is not registered)"; for kCudaDriverError the CUresult too.
std::string describe(abi::Error error);
// The words for one cuFile code, without the number.
std::string code_text(int code);
// A negative cuFileRead/cuFileWrite result in words: -1 uses `saved_errno`, -5xxx a cuFile code.
std::string describe_io_result(long result, int saved_errno);

}  // namespace ferry::cufile
