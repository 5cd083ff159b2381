#include "platform/cufile_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "platform/text_file.h"

extern char** environ;

namespace ferry::platform {
namespace {

using nlohmann::json;

std::string type_words(const json& v) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return fmt::format("number {}", v.dump());
  if (v.is_number()) return fmt::format("number {}", v.dump());
  if (v.is_string()) return fmt::format("string {}", v.dump());
  return std::string(v.type_name());
}

// Finds `key` ("section.name") in the document; nullptr when absent. A section that exists but
// is not an object is reported once through `problems`.
const json* lookup(const json& doc, std::string_view dotted, std::vector<std::string>& problems) {
  auto dot = dotted.find('.');
  std::string section(dotted.substr(0, dot)), name(dotted.substr(dot + 1));
  auto s = doc.find(section);
  if (s == doc.end()) return nullptr;
  if (!s->is_object()) {
    std::string p = fmt::format("{}: expected an object, found {}", section, type_words(*s));
    if (std::find(problems.begin(), problems.end(), p) == problems.end()) problems.push_back(p);
    return nullptr;
  }
  auto v = s->find(name);
  return v == s->end() ? nullptr : &*v;
}

void apply(const json& doc, CufileValue<bool>& out, std::vector<std::string>& problems) {
  const json* v = lookup(doc, out.key, problems);
  if (!v) return;
  out.source = ValueSource::kFile;
  if (v->is_boolean()) {
    out.value = v->get<bool>();
    return;
  }
  out.value.reset();
  out.problem = fmt::format("{}: expected true or false, found {}", out.key, type_words(*v));
  problems.push_back(out.problem);
}

void apply(const json& doc, CufileValue<std::uint64_t>& out, std::vector<std::string>& problems) {
  const json* v = lookup(doc, out.key, problems);
  if (!v) return;
  out.source = ValueSource::kFile;
  if (v->is_number_unsigned()) {
    out.value = v->get<std::uint64_t>();
    return;
  }
  out.value.reset();
  out.problem =
      fmt::format("{}: expected a non-negative integer, found {}", out.key, type_words(*v));
  problems.push_back(out.problem);
}

std::optional<bool> parse_env_bool(std::string s) {
  s = lower(s);
  if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  return std::nullopt;
}

void apply_environment(CufileConfig& c, const Environment& env) {
  for (const auto& [k, v] : env)
    if (k.rfind("CUFILE_", 0) == 0) c.cufile_env.emplace_back(k, v);
  auto it = env.find("CUFILE_FORCE_COMPAT_MODE");
  if (it == env.end()) return;
  c.force_compat_mode.source = ValueSource::kEnvironment;
  if (auto b = parse_env_bool(it->second)) {
    c.force_compat_mode.value = *b;
    c.force_compat_mode.problem.clear();
  } else {
    c.force_compat_mode.value.reset();
    c.force_compat_mode.problem = fmt::format(
        "CUFILE_FORCE_COMPAT_MODE={}: not a boolean; what cuFile makes of it is not "
        "known",
        it->second);
    c.problems.push_back(c.force_compat_mode.problem);
  }
}

// The file exists but cannot be used (`state`, because `why`): cuFile's behaviour with a broken
// cufile.json was not measured, so every value is unknown rather than a default.
void unusable(CufileConfig& c, CufileFileState state, std::string why) {
  c.state = state;
  c.state_detail = std::move(why);
  auto clear = [&](auto& v) {
    v.value.reset();
    v.problem = c.state_detail;
  };
  clear(c.allow_compat_mode);
  clear(c.force_compat_mode);
  clear(c.use_pci_p2pdma);
  clear(c.max_direct_io_size_kb);
  clear(c.parallel_io);
  clear(c.max_io_threads);
  clear(c.min_io_threshold_size_kb);
  clear(c.max_request_parallelism);
  clear(c.max_io_queue_depth);
}

// nlohmann's message starts "[json.exception.parse_error.101] parse error at line 3, column 7: ";
// keep what follows, since ferry computes line and column itself.
std::string short_message(const std::string& what) {
  auto col = what.find("column ");
  if (col != std::string::npos) {
    auto sep = what.find(": ", col);
    if (sep != std::string::npos) return what.substr(sep + 2);
  }
  return what;
}

// nlohmann reports the last byte it read, which is the end of the offending token; people look
// for where the token starts ("min_io_threshold_size_kb" after a missing comma).
std::size_t token_start(std::string_view text, std::size_t offset) {
  if (offset >= text.size()) return offset;
  if (text[offset] == '"' && offset > 0) {
    auto open = text.rfind('"', offset - 1);
    auto nl = text.rfind('\n', offset);
    if (open != std::string_view::npos && (nl == std::string_view::npos || open > nl)) return open;
    return offset;
  }
  auto word = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '+';
  };
  while (offset > 0 && word(text[offset]) && word(text[offset - 1])) --offset;
  return offset;
}

}  // namespace

std::string_view to_string(ValueSource s) {
  switch (s) {
    case ValueSource::kDefault:
      return "default";
    case ValueSource::kFile:
      return "file";
    case ValueSource::kEnvironment:
      return "environment";
  }
  return "?";
}

std::string_view to_string(CufileFileState s) {
  switch (s) {
    case CufileFileState::kLoaded:
      return "loaded";
    case CufileFileState::kMissing:
      return "missing";
    case CufileFileState::kUnreadable:
      return "unreadable";
    case CufileFileState::kEmpty:
      return "empty";
    case CufileFileState::kTooLarge:
      return "too large";
    case CufileFileState::kNotUtf8:
      return "not UTF-8";
    case CufileFileState::kMalformed:
      return "malformed";
  }
  return "?";
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    if (kv.substr(0, 7) == "CUFILE_") env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

CufileConfig default_cufile_config() {
  CufileConfig c;
  c.allow_compat_mode.value = true;
  c.force_compat_mode.value = false;
  c.use_pci_p2pdma.value = false;
  c.max_direct_io_size_kb.value = 16384;
  c.parallel_io.value = true;
  c.max_io_threads.value = 4;
  c.min_io_threshold_size_kb.value = 8192;
  c.max_request_parallelism.value = 4;
  c.max_io_queue_depth.value = 128;
  return c;
}

std::pair<std::size_t, std::size_t> line_and_column(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  auto before = text.substr(0, offset);
  std::size_t line = 1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
  auto nl = before.rfind('\n');
  std::size_t column = nl == std::string_view::npos ? offset + 1 : offset - nl;
  return {line, column};
}

std::optional<std::size_t> first_invalid_utf8(std::string_view t) {
  std::size_t i = 0;
  while (i < t.size()) {
    auto c = static_cast<unsigned char>(t[i]);
    std::size_t n = 0;
    unsigned min = 0;
    if (c < 0x80)
      n = 0;
    else if (c >= 0xC2 && c <= 0xDF)
      n = 1, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
      n = 2, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
      n = 3, min = 0x10000;
    else
      return i;
    if (i + n >= t.size() && n > 0) return i;
    unsigned cp = n == 0 ? c : (c & (0x3F >> n));
    for (std::size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<unsigned char>(t[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n + 1;
  }
  return std::nullopt;
}

CufileConfig parse_cufile_config(std::string_view text, const Environment& env) {
  CufileConfig c = default_cufile_config();
  auto finish = [&]() {
    apply_environment(c, env);
    return c;
  };
  if (trim(text).empty()) {
    unusable(c, CufileFileState::kEmpty,
             "cufile.json is empty; what cuFile does with an empty file is not known");
    return finish();
  }
  if (auto bad = first_invalid_utf8(text)) {
    auto [line, col] = line_and_column(text, *bad);
    c.parse_error = CufileParseError{*bad, line, col, "invalid UTF-8 byte"};
    unusable(c, CufileFileState::kNotUtf8,
             fmt::format("cufile.json is not UTF-8: byte {:#04x} at line {}, column {}",
                         static_cast<unsigned char>(text[*bad]), line, col));
    return finish();
  }
  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/true,
                      /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    // e.byte is the 1-based index of the last byte read, the end of the token that broke it.
    // For an unterminated comment nlohmann reports a byte past the end: clamp it.
    std::size_t offset =
        token_start(text, std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size()));
    auto [line, col] = line_and_column(text, offset);
    c.parse_error = CufileParseError{offset, line, col, short_message(e.what())};
    unusable(c, CufileFileState::kMalformed,
             fmt::format("cufile.json does not parse at line {}, column {}: {}", line, col,
                         c.parse_error->message));
    return finish();
  } catch (const json::out_of_range& e) {
    // A number too large for a double (found by fuzzing): malformed, not an exception.
    unusable(c, CufileFileState::kMalformed,
             fmt::format("cufile.json does not parse: {}", short_message(e.what())));
    return finish();
  }
  if (!doc.is_object()) {
    unusable(c, CufileFileState::kMalformed,
             fmt::format("cufile.json: expected an object at the top, found {}", type_words(doc)));
    return finish();
  }
  c.state = CufileFileState::kLoaded;
  apply(doc, c.allow_compat_mode, c.problems);
  apply(doc, c.force_compat_mode, c.problems);
  apply(doc, c.use_pci_p2pdma, c.problems);
  apply(doc, c.max_direct_io_size_kb, c.problems);
  apply(doc, c.parallel_io, c.problems);
  apply(doc, c.max_io_threads, c.problems);
  apply(doc, c.min_io_threshold_size_kb, c.problems);
  apply(doc, c.max_request_parallelism, c.problems);
  apply(doc, c.max_io_queue_depth, c.problems);
  // Newer files comment max_direct_io_size_kb out in favour of bounce-buffer slabs, from which
  // cuFile derives it (GDS configuration guide); the legacy default would then be a guess.
  if (c.max_direct_io_size_kb.source == ValueSource::kDefault) {
    std::vector<std::string> ignored;
    if (lookup(doc, "properties.gpu_bounce_buffer_slab_config", ignored)) {
      c.max_direct_io_size_kb.value.reset();
      c.max_direct_io_size_kb.problem =
          "not set: cuFile derives it from properties.gpu_bounce_buffer_slab_config";
    }
  }
  c.state_detail =
      c.problems.empty() ? "parsed" : fmt::format("parsed with {} problem(s)", c.problems.size());
  return finish();
}

CufileConfig read_cufile_config(const std::filesystem::path& root, const Environment& env) {
  std::filesystem::path path(kCufileDefaultPath);
  bool from_env = false;
  if (auto it = env.find("CUFILE_ENV_PATH_JSON"); it != env.end() && !it->second.empty()) {
    path = it->second;
    from_env = true;
  }
  auto finish = [&](CufileConfig c) {
    c.path = path;
    c.path_from_env = from_env;
    return c;
  };
  auto file = read_text_file(under_root(root, path), kCufileJsonCap);
  if (!file.ok) {
    CufileConfig c = default_cufile_config();
    apply_environment(c, env);
    if (file.missing) {
      c.state = CufileFileState::kMissing;
      c.state_detail =
          fmt::format("{} does not exist{}; values shown are cuFile's documented defaults",
                      path.string(), from_env ? " (named by CUFILE_ENV_PATH_JSON)" : "");
    } else {
      unusable(c, CufileFileState::kUnreadable,
               fmt::format("{}; the values cuFile uses are not known", file.error));
    }
    return finish(std::move(c));
  }
  if (file.truncated) {
    CufileConfig c = default_cufile_config();
    unusable(c, CufileFileState::kTooLarge,
             fmt::format("{} is {} bytes; ferry reads at most {} bytes of cufile.json",
                         path.string(), file.size, kCufileJsonCap));
    apply_environment(c, env);
    return finish(std::move(c));
  }
  return finish(parse_cufile_config(file.text, env));
}

}  // namespace ferry::platform
