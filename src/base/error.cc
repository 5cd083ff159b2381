#include "ferry/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/utf8.h"
#include "ferry/printable.h"

namespace ferry {

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = base::utf8_length(text.substr(i));
    const bool c1 = n == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;
    if (n == 0 || c < 0x20 || c == 0x7f || c1) {
      for (std::size_t k = 0; k < std::max<std::size_t>(n, 1); ++k) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[i + k]));
      }
      i += std::max<std::size_t>(n, 1);
      continue;
    }
    out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

SettingError::SettingError(std::string setting, std::string value, const std::string& message)
    : Error(message), setting_(std::move(setting)), value_(std::move(value)) {}

namespace {
std::string io_message(int err, const std::string& op, const std::string& path,
                       std::uint64_t offset, std::uint64_t length, std::uint64_t bytes_done,
                       const std::string& detail) {
  std::string where =
      length > 0 || offset > 0 ? fmt::format(" offset={} len={}", offset, length) : std::string();
  std::string text =
      fmt::format("{} {}{}: {}", op, path, where, detail.empty() ? std::strerror(err) : detail);
  if (bytes_done > 0) text += fmt::format(" ({} bytes done before the failure)", bytes_done);
  return text;
}
}  // namespace

IoError::IoError(int err, std::string op, std::string path, std::uint64_t offset,
                 std::uint64_t length, std::uint64_t bytes_done, const std::string& detail)
    : Error(io_message(err, op, path, offset, length, bytes_done, detail)),
      errno_(err),
      op_(std::move(op)),
      path_(std::move(path)),
      offset_(offset),
      length_(length),
      bytes_done_(bytes_done),
      detail_(detail) {}

IoError IoError::with_bytes_done(std::uint64_t bytes_done) const {
  return IoError(errno_, op_, path_, offset_, length_, bytes_done, detail_);
}

}  // namespace ferry
