// Fuzzes the parser of udev database entries (/run/udev/data/b<major>:<minor>): only
// "E:KEY=VALUE" lines count, and a key is never empty.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "platform/udev_db.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& [key, value] : ferry::platform::parse_udev_properties(text)) {
    FUZZ_CHECK(!(key.empty() || key.find('\n') != std::string::npos));
  }
  return 0;
}
