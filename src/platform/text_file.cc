#include "platform/text_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace ferry::platform {

TextFile read_text_file(const std::filesystem::path& path, std::size_t cap) {
  TextFile out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    out.missing = err == ENOENT || err == ENOTDIR;
    out.error = fmt::format("open {}: {}", path.string(), std::strerror(err));
    return out;
  }
  std::string buf(64 * 1024, '\0');
  for (;;) {
    if (out.text.size() >= cap) {
      char probe;
      ssize_t more = ::read(fd, &probe, 1);
      out.truncated = more > 0;
      break;
    }
    std::size_t want = std::min(buf.size(), cap - out.text.size());
    ssize_t n = ::read(fd, buf.data(), want);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      out.error =
          fmt::format("read {} offset={}: {}", path.string(), out.text.size(), std::strerror(err));
      ::close(fd);
      return out;
    }
    if (n == 0) break;
    out.text.append(buf.data(), static_cast<std::size_t>(n));
  }
  out.size = out.text.size();
  if (out.truncated) {
    std::error_code ec;
    auto real = std::filesystem::file_size(path, ec);
    if (!ec && real > out.size) out.size = real;
  }
  ::close(fd);
  out.ok = true;
  return out;
}

std::filesystem::path under_root(const std::filesystem::path& root,
                                 const std::filesystem::path& p) {
  return root / p.relative_path();
}

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    auto nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

std::vector<std::string_view> split_whitespace(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    std::size_t b = i;
    while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i > b) out.push_back(text.substr(b, i - b));
  }
  return out;
}

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  s = trim(s);
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<std::int64_t> parse_i64(std::string_view s) {
  s = trim(s);
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_double(std::string_view s) {
  s = trim(s);
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace ferry::platform
