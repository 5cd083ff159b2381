#include "platform/udev_db.h"

#include <fmt/format.h>

#include "platform/text_file.h"

namespace ferry::platform {

std::string_view to_string(UdevState s) {
  switch (s) {
    case UdevState::kFound:
      return "found";
    case UdevState::kNoUdevDir:
      return "no /run/udev";
    case UdevState::kNoEntry:
      return "no entry";
    case UdevState::kUnreadable:
      return "unreadable";
  }
  return "?";
}

std::map<std::string, std::string> parse_udev_properties(std::string_view text) {
  std::map<std::string, std::string> out;
  for (auto raw : split_lines(text)) {
    auto line = trim(raw);
    if (line.substr(0, 2) != "E:") continue;
    auto kv = line.substr(2);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    out[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
  }
  return out;
}

UdevEntry read_udev_entry(const std::filesystem::path& root, DeviceNumber device) {
  UdevEntry e;
  std::filesystem::path name = fmt::format("b{}:{}", device.major, device.minor);
  e.path = std::filesystem::path("/run/udev/data") / name;
  std::error_code ec;
  if (!std::filesystem::is_directory(under_root(root, "/run/udev"), ec)) {
    e.state = UdevState::kNoUdevDir;
    e.reason =
        "/run/udev does not exist (no udev, or a container started without "
        "-v /run/udev:/run/udev:ro): cuFile cannot find ID_FS_USAGE and "
        "cuFileHandleRegister fails with 5027";
    return e;
  }
  auto f = read_text_file(under_root(root, e.path));
  if (!f.ok) {
    e.state = f.missing ? UdevState::kNoEntry : UdevState::kUnreadable;
    e.reason = f.missing
                   ? fmt::format(
                         "udev has no entry {} for device {}: cuFile cannot find "
                         "ID_FS_USAGE and cuFileHandleRegister fails with 5027",
                         e.path.string(), to_string(device))
                   : fmt::format("{}: whether cuFile can find ID_FS_USAGE is unknown", f.error);
    return e;
  }
  e.state = UdevState::kFound;
  e.properties = parse_udev_properties(f.text);
  auto it = e.properties.find("ID_FS_USAGE");
  e.has_fs_usage = it != e.properties.end();
  e.reason = e.has_fs_usage
                 ? fmt::format("{} has ID_FS_USAGE={}", e.path.string(), it->second)
                 : fmt::format("{} has no ID_FS_USAGE: cuFileHandleRegister fails with 5027",
                               e.path.string());
  return e;
}

}  // namespace ferry::platform
