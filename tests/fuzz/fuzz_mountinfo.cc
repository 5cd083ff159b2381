// Fuzzes the /proc/self/mountinfo parser, the octal unescaping of its fields and the lookup of
// the mount that holds a path. Unparseable lines must be reported, never thrown.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "platform/mountinfo.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::platform;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> errors;
  std::vector<MountEntry> mounts = parse_mountinfo(text, &errors);
  FUZZ_CHECK(unescape_mount_field(text).size() <= text.size());
  for (const char* path : {"/", "/data/x.bin", "/a b/c"}) {
    MountLookup none = find_mount(mounts, path, std::nullopt);
    FUZZ_CHECK(!none.how.empty());
    if (none.mount) FUZZ_CHECK(!none.by_device);
  }
  // Every mount is found at its own mount point, when that is a normalised absolute path (the
  // lookup's contract).
  for (const MountEntry& m : mounts) {
    const std::string& mp = m.mount_point;
    if (mp.empty() || mp[0] != '/' || mp.find("//") != std::string::npos) continue;
    if (mp.size() > 1 && mp.back() == '/') continue;
    if (std::filesystem::path(mp).lexically_normal().string() != mp) continue;
    MountLookup found = find_mount(mounts, std::string(m.mount_point), m.device);
    FUZZ_CHECK(found.mount.has_value());
  }
  return 0;
}
