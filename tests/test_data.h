// Where a test finds the data committed in tests/data: the folder FERRY_TEST_DATA names (CTest sets
// it, tests/CMakeLists.txt), else the source tree's tests/data that the binary was built from
// (FERRY_TEST_DATA_DIR, given to targets declared with ferry_add_test(... DATA)). Thread-safe.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#ifndef FERRY_TEST_DATA_DIR
#error "test_data.h: declare the test target with ferry_add_test(... DATA) (tests/CMakeLists.txt)"
#endif

namespace ferry::test {

// The test data folder, or its sub-folder `sub` (such as "platform"). Throws, naming
// FERRY_TEST_DATA and the folder it looked in, when that folder is missing, so a test run outside
// CTest fails with the reason rather than a bad path (a null getenv once crashed dcp_reader_tests).
inline std::filesystem::path test_data(const std::filesystem::path& sub = {}) {
  const char* set = std::getenv("FERRY_TEST_DATA");
  std::filesystem::path dir = set != nullptr && *set != '\0' ? set : FERRY_TEST_DATA_DIR;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    std::string how = set != nullptr && *set != '\0'
                          ? "FERRY_TEST_DATA names " + dir.string()
                          : "FERRY_TEST_DATA is unset, so the built-in " + dir.string();
    throw std::runtime_error(how +
                             ", which is not a folder: set FERRY_TEST_DATA to the tests/data "
                             "folder of ferry's source tree");
  }
  return dir / sub;
}

}  // namespace ferry::test
