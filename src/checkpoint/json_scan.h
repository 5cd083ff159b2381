// Strict JSON over text in memory, for the checkpoint formats: JsonCursor scans RFC 8259 JSON
// (UTF-8 validated, any trailing byte but whitespace refused) fast enough for a 100 MB
// safetensors header, and parse_strict builds a nlohmann value in linear time with duplicate
// keys and deep nesting refused. Pure functions over bytes; not thread-safe per object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ferry::checkpoint {

// Text that is not JSON: what was wrong, at which byte offset.
class JsonSyntaxError : public std::runtime_error {
 public:
  JsonSyntaxError(const std::string& what, std::size_t offset);
  std::size_t offset() const { return offset_; }

 private:
  std::size_t offset_;
};

// A value with containers nested deeper than skip_value's `max_depth`.
class JsonTooDeep : public std::runtime_error {
 public:
  JsonTooDeep() : std::runtime_error("nested too deep") {}
};

class JsonCursor {
 public:
  explicit JsonCursor(std::string_view text) : s_(text) {}

  std::size_t pos() const { return i_; }
  void set_pos(std::size_t pos) { i_ = pos; }
  bool at_end() const { return i_ >= s_.size(); }
  // Skips JSON whitespace (space, tab, line feed, carriage return).
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t'))
      ++i_;
  }
  // Consumes `c` when it is next.
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* what) {
    if (!eat(c)) fail(what);
  }
  // A string at the cursor, unescaped into `out`; throws JsonSyntaxError for anything JSON
  // forbids (control characters, bad escapes, lone surrogates, bytes that are not UTF-8).
  void string(std::string& out);
  // A string of printable ASCII without escapes (the format's own keys and dtypes): true and
  // consumed, or false with the cursor unchanged.
  bool plain_string(std::string_view& out);
  // An unsigned integer written plainly (no sign, fraction or exponent) that fits 64 bits: true
  // and consumed, or false with the cursor unchanged.
  bool plain_uint(std::uint64_t& out);
  // Skips one value, checking its grammar; containers nested more than `max_depth` deep (the
  // value itself counts 1) throw JsonTooDeep.
  void skip_value(int max_depth);
  [[noreturn]] void fail(const std::string& what) const;

 private:
  void escape(std::string& out);
  void number();

  std::string_view s_;
  std::size_t i_ = 0;
};

// `text` as a nlohmann value, built through its SAX interface (linear time), every object
// checked for duplicate keys (`on_duplicate(key, depth)` must throw; depth 1 is a key of the
// top-level object) and containers limited to `max_depth` levels (`on_too_deep()` must throw).
// A syntax error calls `on_syntax(message)`, which must throw.
nlohmann::json parse_strict(std::string_view text, int max_depth,
                            const std::function<void(const std::string&, int)>& on_duplicate,
                            const std::function<void()>& on_too_deep,
                            const std::function<void(const std::string&)>& on_syntax);

// nlohmann's own message for `text`'s first syntax error, or empty when it finds none: the
// wording users of nlohmann-based tools know, for the error path only.
std::string nlohmann_syntax_message(std::string_view text);

}  // namespace ferry::checkpoint
