// Host buffers: Buffer's pageable allocations and the huge-page advice they and Python's torch
// tensors are given (ferry::advise_huge_pages). The advice is checked where the kernel records
// it: the "hg" flag of the mapping in /proc/self/smaps.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "ferry/memory.h"
#include "test_util.h"

namespace ferry {
namespace {

constexpr std::size_t kHuge = std::size_t{2} << 20;

// Whether this kernel takes MADV_HUGEPAGE at all (built without THP: EINVAL).
bool kernel_has_thp() {
  void* p = mmap(nullptr, 2 * kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = madvise(p, 2 * kHuge, MADV_HUGEPAGE) == 0;
  munmap(p, 2 * kHuge);
  return ok;
}

TEST(HostBuffer, AdviceCoversTheWholeHugePagesInsideTheRangeOnly) {
  if (!kernel_has_thp()) GTEST_SKIP() << "this kernel refuses MADV_HUGEPAGE (no THP)";
  const std::size_t span = 8 * kHuge;
  void* map = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* base = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(map) + kHuge - 1) / kHuge *
                                       kHuge);  // >= 6 pages left
  // One byte short of a huge page on each side of two whole ones: those two only.
  EXPECT_EQ(advise_huge_pages(base + 1, 3 * kHuge - 2), kHuge);
  EXPECT_EQ(advise_huge_pages(base + kHuge, 2 * kHuge), 2 * kHuge);
  EXPECT_EQ(advise_huge_pages(base + 1, kHuge), 0u) << "no whole huge page inside";
  EXPECT_EQ(advise_huge_pages(base, 0), 0u);
  EXPECT_EQ(advise_huge_pages(reinterpret_cast<void*>(UINTPTR_MAX - 10), 100), 0u)
      << "a range past the end of the address space";
  EXPECT_NE(test::mapping_facts(base + kHuge).flags.find(" hg"), std::string::npos)
      << test::mapping_facts(base + kHuge).flags;
  munmap(map, span);
}

TEST(HostBuffer, LargeBuffersAreHugePageAlignedAndAdvisedSmallOnesArePageAligned) {
  const Buffer small(MemoryKind::kHostPageable, kHuge - 1);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small.data()) % 4096, 0u);
  const Buffer large(MemoryKind::kHostPageable, 3 * kHuge + 12345);
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(large.data()) % kHuge, 0u);
  // Every byte is usable: the tail past the last whole huge page too.
  std::memset(large.data(), 0x5a, large.size());
  EXPECT_EQ(static_cast<unsigned char*>(large.data())[large.size() - 1], 0x5a);
  if (!kernel_has_thp()) GTEST_SKIP() << "this kernel refuses MADV_HUGEPAGE (no THP)";
  EXPECT_NE(test::mapping_facts(large.data()).flags.find(" hg"), std::string::npos)
      << test::mapping_facts(large.data()).flags;
}

}  // namespace
}  // namespace ferry
