// UTF-8 validation shared by the strict JSON scanner and printable(): pure, thread-safe.
#pragma once

#include <cstddef>
#include <string_view>

namespace ferry::base {

// The length of the well-formed UTF-8 sequence at the start of `s` (1 to 4), or 0 when there is
// none (a stray continuation byte, an overlong form, a surrogate, a code point past U+10FFFF, a
// sequence cut short). `s` must not be empty.
inline std::size_t utf8_length(std::string_view s) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = b(0);
  if (lead < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) n = 2;
  if (lead >= 0xe0 && lead <= 0xef) n = 3;
  if (lead >= 0xf0 && lead <= 0xf4) n = 4;
  if (lead == 0xe0) lo = 0xa0;
  if (lead == 0xed) hi = 0x9f;
  if (lead == 0xf0) lo = 0x90;
  if (lead == 0xf4) hi = 0x8f;
  if (n == 0 || s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (std::size_t i = 2; i < n; ++i) {
    if (b(i) < 0x80 || b(i) > 0xbf) return 0;
  }
  return n;
}

}  // namespace ferry::base
