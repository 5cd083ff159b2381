// cuFile's configuration as cuFile would see it: which cufile.json it reads (CUFILE_ENV_PATH_JSON
// or /etc/cufile.json), the effective scheduling and compatibility values with where each came
// from (documented default, the file, or the environment), and every problem with the file.
// Parsing is pure; the reader takes a root directory and an injected environment. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry::platform {

// Only the variables that matter are needed; process_environment() collects CUFILE_*.
using Environment = std::map<std::string, std::string>;
Environment process_environment();

inline constexpr std::size_t kCufileJsonCap = std::size_t{4} << 20;
inline constexpr std::string_view kCufileDefaultPath = "/etc/cufile.json";

enum class ValueSource { kDefault, kFile, kEnvironment };
std::string_view to_string(ValueSource s);

// One effective value. `value` is empty when it cannot be known (wrong type in the file, file
// unparseable); `problem` then says why.
template <typename T>
struct CufileValue {
  explicit CufileValue(std::string k) : key(std::move(k)) {}
  std::string key;  // "execution.parallel_io"
  std::optional<T> value;
  ValueSource source = ValueSource::kDefault;
  std::string problem;
};

enum class CufileFileState {
  kLoaded,
  kMissing,
  kUnreadable,
  kEmpty,
  kTooLarge,
  kNotUtf8,
  kMalformed
};
std::string_view to_string(CufileFileState s);

struct CufileParseError {
  std::size_t byte_offset = 0;  // 0-based offset of the offending byte
  std::size_t line = 0;         // 1-based
  std::size_t column = 0;       // 1-based, in bytes
  std::string message;
};

struct CufileConfig {
  std::filesystem::path path;  // as cuFile names it (not prefixed by the root)
  bool path_from_env = false;  // CUFILE_ENV_PATH_JSON chose it
  CufileFileState state = CufileFileState::kMissing;
  std::string state_detail;                     // the reason in words
  std::optional<CufileParseError> parse_error;  // kMalformed / kNotUtf8
  std::vector<std::string> problems;            // wrong types, named by key

  CufileValue<bool> allow_compat_mode{"properties.allow_compat_mode"};
  CufileValue<bool> force_compat_mode{"properties.force_compat_mode"};
  CufileValue<bool> use_pci_p2pdma{"properties.use_pci_p2pdma"};
  CufileValue<std::uint64_t> max_direct_io_size_kb{"properties.max_direct_io_size_kb"};
  CufileValue<bool> parallel_io{"execution.parallel_io"};
  CufileValue<std::uint64_t> max_io_threads{"execution.max_io_threads"};
  CufileValue<std::uint64_t> min_io_threshold_size_kb{"execution.min_io_threshold_size_kb"};
  CufileValue<std::uint64_t> max_request_parallelism{"execution.max_request_parallelism"};
  CufileValue<std::uint64_t> max_io_queue_depth{"execution.max_io_queue_depth"};

  std::vector<std::pair<std::string, std::string>> cufile_env;  // every CUFILE_* set, sorted
};

// cuFile's documented defaults (GDS configuration guide, "GPUDirect Storage Parameters").
CufileConfig default_cufile_config();

// Parses `text` as cufile.json (with // comments) and applies `env` on top.
CufileConfig parse_cufile_config(std::string_view text, const Environment& env);

// Locates and reads cufile.json under `root` ("/" in production), capped at kCufileJsonCap.
CufileConfig read_cufile_config(const std::filesystem::path& root, const Environment& env);

// Line and column (1-based) of a byte offset in `text`.
std::pair<std::size_t, std::size_t> line_and_column(std::string_view text, std::size_t offset);

// Offset of the first byte that is not valid UTF-8, if any.
std::optional<std::size_t> first_invalid_utf8(std::string_view text);

}  // namespace ferry::platform
