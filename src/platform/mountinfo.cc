#include "platform/mountinfo.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstring>

#include "platform/text_file.h"

namespace ferry::platform {
namespace {

// True when `mount_point` is `path` or one of its ancestors, on component boundaries.
bool is_prefix(std::string_view mount_point, std::string_view path) {
  if (mount_point == "/") return true;
  if (path.substr(0, mount_point.size()) != mount_point) return false;
  return path.size() == mount_point.size() || path[mount_point.size()] == '/';
}

std::optional<DeviceNumber> parse_device(std::string_view s) {
  auto colon = s.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto ma = parse_u64(s.substr(0, colon)), mi = parse_u64(s.substr(colon + 1));
  if (!ma || !mi) return std::nullopt;
  return DeviceNumber{static_cast<unsigned>(*ma), static_cast<unsigned>(*mi)};
}

}  // namespace

std::string to_string(DeviceNumber d) { return fmt::format("{}:{}", d.major, d.minor); }

std::string unescape_mount_field(std::string_view f) {
  std::string out;
  out.reserve(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '\\' && i + 3 < f.size()) {
      auto d = f.substr(i + 1, 3);
      if (d[0] >= '0' && d[0] <= '3' && d[1] >= '0' && d[1] <= '7' && d[2] >= '0' && d[2] <= '7') {
        out += static_cast<char>((d[0] - '0') * 64 + (d[1] - '0') * 8 + (d[2] - '0'));
        i += 3;
        continue;
      }
    }
    out += f[i];
  }
  return out;
}

std::vector<MountEntry> parse_mountinfo(std::string_view text, std::vector<std::string>* errors) {
  std::vector<MountEntry> out;
  std::size_t line_no = 0;
  for (auto line : split_lines(text)) {
    ++line_no;
    if (trim(line).empty()) continue;
    auto f = split_whitespace(line);
    auto fail = [&](std::string_view why) {
      if (errors) errors->push_back(fmt::format("mountinfo line {}: {}", line_no, why));
    };
    // id parent major:minor root mount_point options [optional...] - fstype source super_options
    std::size_t sep = 6;
    while (sep < f.size() && f[sep] != "-") ++sep;
    if (f.size() < 6 || sep + 2 >= f.size()) {
      fail("expected 'ID PARENT MAJ:MIN ROOT MOUNT OPTIONS ... - TYPE SOURCE SUPER'");
      continue;
    }
    MountEntry m;
    auto id = parse_i64(f[0]), parent = parse_i64(f[1]);
    auto dev = parse_device(f[2]);
    if (!id || !parent || !dev) {
      fail("bad mount id, parent id or major:minor");
      continue;
    }
    m.mount_id = static_cast<int>(*id);
    m.device = *dev;
    m.root = unescape_mount_field(f[3]);
    m.mount_point = unescape_mount_field(f[4]);
    m.mount_options = std::string(f[5]);
    for (std::size_t i = 6; i < sep; ++i) m.optional_fields.emplace_back(f[i]);
    m.fs_type = unescape_mount_field(f[sep + 1]);
    m.source = unescape_mount_field(f[sep + 2]);
    if (sep + 3 < f.size()) m.super_options = std::string(f[sep + 3]);
    out.push_back(std::move(m));
  }
  return out;
}

MountLookup find_mount(const std::vector<MountEntry>& mounts, const std::filesystem::path& path,
                       std::optional<DeviceNumber> device) {
  MountLookup r;
  std::string p = path.lexically_normal().string();
  if (p.size() > 1 && p.back() == '/') p.pop_back();
  auto best = [&](bool match_device) -> const MountEntry* {
    const MountEntry* b = nullptr;
    for (const auto& m : mounts) {
      if (match_device && !(m.device == *device)) continue;
      if (!is_prefix(m.mount_point, p)) continue;
      if (!b || m.mount_point.size() >= b->mount_point.size()) b = &m;  // later wins ties
    }
    return b;
  };
  if (device) {
    if (const auto* m = best(true)) {
      r.mount = *m;
      r.by_device = true;
      r.how = fmt::format("by device {} and mount point {}", to_string(*device), m->mount_point);
      return r;
    }
  }
  if (const auto* m = best(false)) {
    r.mount = *m;
    r.how = device ? fmt::format("no mount of device {} holds {}; longest mount-point prefix {}",
                                 to_string(*device), p, m->mount_point)
                   : fmt::format("by longest mount-point prefix {}", m->mount_point);
    return r;
  }
  r.how = fmt::format("no mount holds {}", p);
  return r;
}

MountLookup find_mount_for_file(const std::filesystem::path& root,
                                const std::filesystem::path& file) {
  auto text = read_text_file(under_root(root, "/proc/self/mountinfo"));
  if (!text.ok) return MountLookup{std::nullopt, text.error + ": mount unknown", false};
  std::error_code ec;
  auto abs = std::filesystem::weakly_canonical(std::filesystem::absolute(file, ec), ec);
  if (ec) abs = std::filesystem::absolute(file).lexically_normal();
  std::optional<DeviceNumber> dev;
  struct stat st {};
  std::string stat_error;
  if (::stat(file.c_str(), &st) == 0) {
    dev = DeviceNumber{::major(st.st_dev), ::minor(st.st_dev)};
  } else {
    stat_error = fmt::format("stat {}: {}; ", file.string(), std::strerror(errno));
  }
  auto r = find_mount(parse_mountinfo(text.text), abs, dev);
  r.how = stat_error + r.how;
  return r;
}

}  // namespace ferry::platform
