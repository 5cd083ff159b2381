// Fuzzes the parsers of /proc/driver/nvidia-fs/{stats,version,modules,bridges} and the delta of
// two snapshots (the first half of the input as "before", all of it as "after"). Nothing may
// throw; a known delta never goes backwards.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "platform/nvfs_proc.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::platform;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  NvfsSnapshot after, before;
  after.loaded = before.loaded = true;
  after.stats = parse_nvfs_stats(text);
  before.stats = parse_nvfs_stats(text.substr(0, size / 2));
  (void)parse_nvfs_version(text);
  for (const auto& [name, version] : parse_nvfs_modules(text)) FUZZ_CHECK(!name.empty());
  (void)parse_nvfs_bridges(text);
  ferry::NvfsCountersDelta d = delta(after, before);
  if (d.known) {
    FUZZ_CHECK(after.stats->reads && before.stats->reads);
    FUZZ_CHECK(d.reads.n == after.stats->reads->n - before.stats->reads->n);
  } else {
    FUZZ_CHECK(!d.reason.empty());
  }
  return 0;
}
