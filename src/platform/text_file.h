// Reading small text files from /proc, /sys and /etc, and the string helpers the platform parsers
// share. A missing or unreadable file is a value (ok=false with a reason), never an exception.
// All functions are pure or read-only and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/text.h"

namespace ferry::platform {

inline constexpr std::size_t kDefaultReadCap = std::size_t{1} << 20;

struct TextFile {
  bool ok = false;         // the file was opened and read (possibly truncated)
  bool missing = false;    // ENOENT / ENOTDIR: the thing does not exist
  bool truncated = false;  // the file is longer than the cap; `text` holds the first cap bytes
  std::uint64_t size = 0;  // bytes read (or st_size where known and larger than the cap)
  std::string text;
  std::string error;  // "open /proc/x: No such file or directory"
};

// Reads at most `cap` bytes of `path`. /proc and /sys files report st_size 0, so this reads until
// EOF rather than trusting stat.
TextFile read_text_file(const std::filesystem::path& path, std::size_t cap = kDefaultReadCap);

// `root / p` where p is absolute ("/etc/cufile.json" under root "/tmp/t" is "/tmp/t/etc/...").
std::filesystem::path under_root(const std::filesystem::path& root, const std::filesystem::path& p);

using base::lower;
using base::trim;
std::vector<std::string_view> split_lines(std::string_view text);
std::vector<std::string_view> split_whitespace(std::string_view text);
std::optional<std::uint64_t> parse_u64(std::string_view s);  // decimal or 0x hex, whole string
std::optional<std::int64_t> parse_i64(std::string_view s);   // decimal, whole string
std::optional<double> parse_double(std::string_view s);

}  // namespace ferry::platform
