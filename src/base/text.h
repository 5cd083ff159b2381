// The ASCII text helpers every room shares: case folding, trimming of white space (the C
// locale's isspace set) and a case-insensitive prefix test. Pure, thread-safe.
#pragma once

#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>

namespace ferry::base {

inline std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Whether `s` starts with `lower_prefix` (written in lower case), whatever the case of `s`:
// "HTTPS://x" starts with "https://".
inline bool starts_with_nocase(std::string_view s, std::string_view lower_prefix) {
  if (s.size() < lower_prefix.size()) return false;
  for (std::size_t i = 0; i < lower_prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != lower_prefix[i]) return false;
  }
  return true;
}

}  // namespace ferry::base
