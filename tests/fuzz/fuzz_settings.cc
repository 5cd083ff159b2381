// Fuzzes the setting parsers: parse_size, parse_count, parse_compat_mode, parse_require and
// SettingsOverride::set. The first input byte picks the parser; the rest is the text (for set,
// "name=value"). Every failure must be a SettingError naming the setting; every success must
// lie in the documented range and survive a round trip through format_size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ferry/error.h"
#include "ferry/settings.h"
#include "fuzz/fuzz_check.h"

namespace {

void fuzz(std::uint8_t which, std::string_view text) {
  switch (which % 6) {
    case 0: {
      std::uint64_t v = ferry::parse_size(text, "FUZZ_SIZE");
      FUZZ_CHECK(v > 0);
      FUZZ_CHECK(ferry::parse_size(ferry::format_size(v), "FUZZ_SIZE") == v);
      break;
    }
    case 1: {
      std::size_t v = ferry::parse_count(text, "FUZZ_COUNT");
      FUZZ_CHECK(v >= 1 && v <= ferry::kMaxThreads);
      break;
    }
    case 2: {
      ferry::CompatMode m = ferry::parse_compat_mode(text, "FUZZ_MODE");
      FUZZ_CHECK(ferry::parse_compat_mode(ferry::to_string(m), "FUZZ_MODE") == m);
      break;
    }
    case 3: {
      ferry::Require r = ferry::parse_require(text, "FUZZ_REQUIRE");
      FUZZ_CHECK(ferry::parse_require(ferry::to_string(r), "FUZZ_REQUIRE") == r);
      break;
    }
    case 5: {
      // The CLI's --offset: a size, or zero in any spelling.
      std::uint64_t v = ferry::parse_offset(text, "FUZZ_OFFSET");
      FUZZ_CHECK(v == 0 || ferry::parse_offset(ferry::format_size(v), "FUZZ_OFFSET") == v);
      if (v > 0) FUZZ_CHECK(ferry::parse_size(text, "FUZZ_OFFSET") == v);
      break;
    }
    default: {
      auto eq = text.find('=');
      std::string_view name = text.substr(0, eq);
      std::string_view value = eq == std::string_view::npos ? "" : text.substr(eq + 1);
      ferry::SettingsOverride o;
      try {
        o.set(name, value);
      } catch (const ferry::SettingError& e) {
        FUZZ_CHECK(e.setting() == name && !std::string_view(e.what()).empty());
        return;
      }
      ferry::Settings s = o.apply_to(ferry::Settings{});
      FUZZ_CHECK(s.task_size >= ferry::kMinTaskSize && s.task_size <= ferry::kMaxTaskSize);
      FUZZ_CHECK(s.bounce_buffer_size >= ferry::kMinBounceSize &&
                 s.bounce_buffer_size <= ferry::kMaxBounceSize);
      FUZZ_CHECK(s.gds_threshold > 0);
      FUZZ_CHECK(s.nthreads >= 1 && s.nthreads <= ferry::kMaxThreads);
      FUZZ_CHECK(s.host_nthreads >= 1 && s.host_nthreads <= ferry::kMaxThreads);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    fuzz(data[0], text);
  } catch (const ferry::SettingError& e) {
    FUZZ_CHECK(!std::string_view(e.what()).empty());
  }
  return 0;
}
