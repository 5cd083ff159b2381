// Fuzzes the cufile.json parser (JSON with // comments, UTF-8 checks, typed lookups) and the
// CUFILE_FORCE_COMPAT_MODE override. Input: the file, then optionally a NUL byte and the
// environment value. The parser must never throw, and its state must agree with its values.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "platform/cufile_config.h"

namespace {

template <typename T>
void check_value(const ferry::platform::CufileValue<T>& v, bool loaded) {
  // A value is either known or has a reason; without a usable file, none is known.
  FUZZ_CHECK(v.value.has_value() || !v.problem.empty());
  if (!loaded && v.source != ferry::platform::ValueSource::kEnvironment) {
    FUZZ_CHECK(!v.value.has_value());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::platform;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  auto nul = input.find('\0');
  std::string_view text = input.substr(0, nul);
  Environment env;
  if (nul != std::string_view::npos) {
    env["CUFILE_FORCE_COMPAT_MODE"] = std::string(input.substr(nul + 1));
  }
  CufileConfig c = parse_cufile_config(text, env);
  const bool loaded = c.state == CufileFileState::kLoaded;
  FUZZ_CHECK(loaded || c.state == CufileFileState::kEmpty || c.state == CufileFileState::kNotUtf8 ||
             c.state == CufileFileState::kMalformed);
  FUZZ_CHECK(!c.state_detail.empty());
  if (c.state == CufileFileState::kNotUtf8) FUZZ_CHECK(first_invalid_utf8(text).has_value());
  if (loaded) FUZZ_CHECK(!first_invalid_utf8(text).has_value());
  if (c.parse_error) {
    FUZZ_CHECK(c.parse_error->byte_offset <= text.size());
    FUZZ_CHECK(c.parse_error->line >= 1 && c.parse_error->column >= 1);
  }
  check_value(c.allow_compat_mode, loaded);
  check_value(c.force_compat_mode, loaded);
  check_value(c.use_pci_p2pdma, loaded);
  check_value(c.max_direct_io_size_kb, loaded);
  check_value(c.parallel_io, loaded);
  check_value(c.max_io_threads, loaded);
  check_value(c.min_io_threshold_size_kb, loaded);
  check_value(c.max_request_parallelism, loaded);
  check_value(c.max_io_queue_depth, loaded);
  auto [line, column] = line_and_column(text, text.size());
  FUZZ_CHECK(line >= 1 && column >= 1);
  return 0;
}
