// ferry's CUDA driver declarations (src/cuda/cuda_abi.h). The comparison with cuda.h happens at
// compile time in src/cuda/cuda_abi_check.cc; these tests make its outcome visible (skipped,
// with the reason, in a build without cuda.h) and check what holds without the header.
#include "cuda/cuda_abi.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "cuda/cuda_driver.h"

namespace ferry::cuda {
namespace {

TEST(CudaAbi, DeclarationsWereCheckedAgainstCudaHeader) {
  const int version = abi::checked_against_cuda_version();
  if (version == 0) {
    GTEST_SKIP() << "cuda.h was not found at build time, so ferry's CUDA declarations were not "
                    "compared with it (none is needed to build)";
  }
  EXPECT_GE(version, 11000) << "CUDA_VERSION of the header checked against";
  std::printf("checked against cuda.h of CUDA %d.%d\n", version / 1000, version % 1000 / 10);
}

TEST(CudaAbi, HandlesAndDevicePointersHaveTheDriversWidths) {
  static_assert(sizeof(abi::DevicePtr) == 8);
  static_assert(sizeof(abi::Context) == sizeof(void*));
  static_assert(sizeof(abi::Result) == sizeof(int));
  static_assert(sizeof(abi::PointerAttribute) == sizeof(int));
}

TEST(CudaAbi, EveryEntryPointHasOneFieldAndADistinctSymbol) {
  std::set<std::string> symbols;
  int fields = 0;
#define FERRY_COUNT(field, api, symbol) \
  ++fields;                             \
  symbols.insert(symbol);
  FERRY_CUDA_DRIVER_API(FERRY_COUNT)
#undef FERRY_COUNT
  EXPECT_EQ(symbols.size(), static_cast<std::size_t>(fields));
  EXPECT_EQ(sizeof(Driver), fields * sizeof(void*));  // no field outside the list
}

}  // namespace
}  // namespace ferry::cuda
