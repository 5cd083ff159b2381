// Parsing of size, count and enum settings, and reading of the variables that rooms below core
// read themselves (base/variables.h). Every failure names the setting or variable, the value and
// the accepted forms; nothing falls back to a default.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <utility>

#include "base/text.h"
#include "base/variables.h"
#include "ferry/error.h"
#include "ferry/settings.h"
#include "ferry/sizes.h"

namespace ferry {
namespace {

constexpr const char* kSizeForms =
    "a positive whole number of bytes, optionally followed by a unit (case-insensitive): B; "
    "K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024); KB, MB, GB, TB (powers of 1000, as "
    "max_shard_size=\"5GB\"), e.g. 4194304, 4MiB, 16KiB, 4M, 5GB";

using base::lower;
using base::trim;

[[noreturn]] void bad(std::string_view setting, std::string_view text, std::string_view why,
                      std::string_view forms) {
  throw SettingError(std::string(setting), std::string(text),
                     fmt::format("invalid {}='{}': {}; expected {}", setting, text, why, forms));
}

// A whole number from `low` to `high`.
long whole_number(std::string_view text, std::string_view setting, long low, long high) {
  const std::string_view s = trim(text);
  long x = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || x < low || x > high) {
    bad(setting, text, ec == std::errc() && !s.empty() ? "out of range" : "not a whole number",
        fmt::format("a whole number from {} to {}", low, high));
  }
  return x;
}

}  // namespace

namespace {

std::uint64_t parse_bytes(std::string_view text, std::string_view setting, bool allow_zero) {
  std::string_view s = trim(text);
  if (s.empty()) bad(setting, text, "empty value", kSizeForms);
  if (s.front() == '-') bad(setting, text, "negative size", kSizeForms);
  std::uint64_t number = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), number);
  if (ec == std::errc::result_out_of_range) bad(setting, text, "number too large", kSizeForms);
  if (ec != std::errc() || end == s.data()) bad(setting, text, "not a number", kSizeForms);
  std::string unit = lower(trim(std::string_view(end, s.data() + s.size() - end)));
  // huggingface_hub reads max_shard_size="5GB" as 5 * 10^9 bytes: KB to TB are powers of 1000;
  // KiB to TiB and the bare letters (as dd reads them) powers of 1024.
  std::uint64_t scale = 1;
  if (!unit.empty() && unit != "b") {
    const std::size_t power = std::string_view("kmgt").find(unit[0]) + 1;  // 0: not found
    const std::string_view rest = std::string_view(unit).substr(1);
    if (power == 0 || (!rest.empty() && rest != "ib" && rest != "b")) {
      bad(setting, text, fmt::format("unknown unit '{}'", unit), kSizeForms);
    }
    for (std::size_t i = 0; i < power; ++i) scale *= rest == "b" ? 1000 : 1024;
  }
  if (number == 0 && !allow_zero) bad(setting, text, "must be greater than zero", kSizeForms);
  if (number > std::numeric_limits<std::uint64_t>::max() / scale) {
    bad(setting, text, "size too large", kSizeForms);
  }
  return number * scale;
}

}  // namespace

std::uint64_t parse_size(std::string_view text, std::string_view setting) {
  return parse_bytes(text, setting, false);
}

std::uint64_t parse_offset(std::string_view text, std::string_view setting) {
  return parse_bytes(text, setting, true);
}

std::size_t parse_count(std::string_view text, std::string_view setting) {
  return static_cast<std::size_t>(whole_number(text, setting, 1, kMaxThreads));
}

CompatMode parse_compat_mode(std::string_view text, std::string_view setting) {
  std::string s = lower(trim(text));
  if (s == "auto") return CompatMode::kAuto;
  if (s == "on" || s == "true" || s == "yes" || s == "1") return CompatMode::kOn;
  if (s == "off" || s == "false" || s == "no" || s == "0") return CompatMode::kOff;
  bad(setting, text, "unknown mode", "auto, on (never call cuFile) or off (always call cuFile)");
}

Require parse_require(std::string_view text, std::string_view setting) {
  std::string s = lower(trim(text));
  if (s == "any") return Require::kAny;
  if (s == "cufile") return Require::kCufile;
  if (s == "gds") return Require::kGds;
  bad(setting, text, "unknown requirement",
      "any (allow every fallback), cufile (refuse ferry's POSIX fallback) or gds (also refuse "
      "cuFile's compatibility path)");
}

HostLoad parse_host_load(std::string_view text, std::string_view setting) {
  std::string s = lower(trim(text));
  if (s == "auto") return HostLoad::kAuto;
  if (s == "map") return HostLoad::kMap;
  if (s == "read") return HostLoad::kRead;
  bad(setting, text, "unknown host load route",
      "auto (map files resident in the page cache, map and read in the rest), map or read");
}

std::string to_string(HostLoad mode) {
  switch (mode) {
    case HostLoad::kAuto:
      return "auto";
    case HostLoad::kMap:
      return "map";
    case HostLoad::kRead:
      return "read";
  }
  return "?";
}

std::string to_string(CompatMode mode) {
  switch (mode) {
    case CompatMode::kAuto:
      return "auto";
    case CompatMode::kOn:
      return "on";
    case CompatMode::kOff:
      return "off";
  }
  return "?";
}

std::string to_string(Require require) {
  switch (require) {
    case Require::kAny:
      return "any";
    case Require::kCufile:
      return "cufile";
    case Require::kGds:
      return "gds";
  }
  return "?";
}

std::string to_string(SettingSource source) {
  switch (source) {
    case SettingSource::kDefault:
      return "default";
    case SettingSource::kEnvironment:
      return "environment";
    case SettingSource::kCode:
      return "code";
  }
  return "?";
}

namespace {
// About three significant digits, never in exponent form: 3.33, 33.3, 333, 3333.
int decimals(double v) { return v >= 100 ? 0 : v >= 10 ? 1 : 2; }
}  // namespace

std::string format_size(std::uint64_t bytes) { return format_size(bytes, false); }

std::string format_size(std::uint64_t bytes, bool rounded) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  if (!rounded) {
    while (unit < 4 && bytes >= 1024 && bytes % 1024 == 0) {  // up to TiB, as parse_size reads
      bytes /= 1024;
      ++unit;
    }
    return fmt::format("{} {}", bytes, kUnits[unit]);
  }
  double v = static_cast<double>(bytes);
  while (unit < 6 && v >= 1024) {
    v /= 1024;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.{}f} {}", v, decimals(v), kUnits[unit]);
}

std::string format_rate(double bytes_per_s) {
  static constexpr std::pair<double, const char*> kUnits[] = {
      {1e9, "GB/s"}, {1e6, "MB/s"}, {1e3, "kB/s"}, {1, "B/s"}};
  // The first unit the rate reaches; B/s below 1 kB/s.
  const auto& [scale, unit] = *std::find_if(std::begin(kUnits), std::end(kUnits) - 1,
                                            [&](const auto& u) { return bytes_per_s >= u.first; });
  const double v = bytes_per_s / scale;
  return fmt::format("{:.{}f} {}", v, decimals(v), unit);
}

namespace base {
namespace {

// `text` of `env`, which is `var`'s own variable or (`kvikio`) one of KvikIO's, as shown.
std::string checked(const Variable& var, const char* env, std::string_view text, bool kvikio) {
  const std::string s = lower(trim(text));
  switch (var.form) {
    case Form::kWholeNumber: {  // KvikIO's count from 1
      const long extra = kvikio ? var.kvikio_extra : 0;
      return std::to_string(whole_number(text, env, kvikio ? 1 : var.low, var.high + extra) -
                            extra);
    }
    case Form::kHttpStatuses: {
      std::string shown;
      for (int code : parse_http_statuses(text, env)) {
        shown += fmt::format("{}{}", shown.empty() ? "" : ",", code);
      }
      return shown;
    }
    case Form::kSwitch:
      if (s == "1" || s == "on" || s == "true" || s == "yes") return "on";
      if (s == "0" || s == "off" || s == "false" || s == "no") return "off";
      bad(env, text, "unknown switch", "1, on, true, yes, 0, off, false or no");
    case Form::kText:
    case Form::kSetting:
      break;
  }
  return std::string(text);
}

}  // namespace

Reading read(const Variable& var) {
  auto set = [](const char* env) {  // an empty variable means unset, as for the settings
    const char* v = env != nullptr ? std::getenv(env) : nullptr;
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* v = set(var.env)) return {checked(var, var.env, v, false), var.env};
  for (const char* env : var.kvikio) {
    if (const char* v = set(env)) return {checked(var, env, v, true), env};
  }
  return {var.fallback};
}

long read_number(const Variable& var) { return std::stol(read(var).value); }

std::vector<int> parse_http_statuses(std::string_view text, std::string_view env) {
  std::vector<int> out;
  for (std::size_t at = 0, end = 0; at <= text.size(); at = end + 1) {
    end = std::min(text.find(',', at), text.size());
    const std::string_view item = trim(text.substr(at, end - at));
    int code = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), code);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || code < 100 ||
        code > 599) {
      bad(env, text, fmt::format("'{}' is not an HTTP status", item),
          "HTTP statuses (100 to 599) separated by commas, as 429,500,503");
    }
    out.push_back(code);
  }
  return out;
}

}  // namespace base
}  // namespace ferry
