#include "checkpoint/json_scan.h"

#include <fmt/format.h>

#include <vector>

#include "base/utf8.h"

namespace ferry::checkpoint {

JsonSyntaxError::JsonSyntaxError(const std::string& what, std::size_t offset)
    : std::runtime_error(fmt::format("{} at byte {}", what, offset)), offset_(offset) {}

void JsonCursor::fail(const std::string& what) const { throw JsonSyntaxError(what, i_); }

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace

void JsonCursor::escape(std::string& out) {
  // At the character after the backslash.
  if (at_end()) fail("a string ends inside an escape");
  const char c = s_[i_++];
  switch (c) {
    case '"':
    case '\\':
    case '/':
      out += c;
      return;
    case 'b':
      out += '\b';
      return;
    case 'f':
      out += '\f';
      return;
    case 'n':
      out += '\n';
      return;
    case 'r':
      out += '\r';
      return;
    case 't':
      out += '\t';
      return;
    case 'u':
      break;
    default:
      --i_;
      fail("an invalid escape in a string");
  }
  auto four_hex = [&] {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const int d = i_ < s_.size() ? hex_digit(s_[i_]) : -1;
      if (d < 0) fail("a \\u escape without four hex digits");
      v = v * 16 + static_cast<std::uint32_t>(d);
      ++i_;
    }
    return v;
  };
  std::uint32_t cp = four_hex();
  if (cp >= 0xdc00 && cp <= 0xdfff) fail("a lone low surrogate in a \\u escape");
  if (cp >= 0xd800 && cp <= 0xdbff) {
    if (!(eat('\\') && eat('u'))) fail("a high surrogate not followed by a low one");
    const std::uint32_t low = four_hex();
    if (low < 0xdc00 || low > 0xdfff) fail("a high surrogate not followed by a low one");
    cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
  }
  append_utf8(out, cp);
}

void JsonCursor::string(std::string& out) {
  out.clear();
  expect('"', "expected a string");
  std::size_t run = i_;
  while (true) {
    if (at_end()) fail("an unterminated string");
    const auto c = static_cast<unsigned char>(s_[i_]);
    if (c == '"') {
      out.append(s_.substr(run, i_ - run));
      ++i_;
      return;
    }
    if (c < 0x20) fail("a control character in a string (it must be escaped)");
    if (c == '\\') {
      out.append(s_.substr(run, i_ - run));
      ++i_;
      escape(out);
      run = i_;
      continue;
    }
    if (c < 0x80) {
      ++i_;
      continue;
    }
    const std::size_t n = base::utf8_length(s_.substr(i_));
    if (n == 0) fail("a byte that is not UTF-8 in a string");
    i_ += n;
  }
}

bool JsonCursor::plain_string(std::string_view& out) {
  if (i_ >= s_.size() || s_[i_] != '"') return false;
  std::size_t j = i_ + 1;
  while (j < s_.size() && s_[j] != '"') {
    const auto c = static_cast<unsigned char>(s_[j]);
    if (c < 0x20 || c >= 0x7f || c == '\\') return false;
    ++j;
  }
  if (j >= s_.size()) return false;
  out = s_.substr(i_ + 1, j - i_ - 1);
  i_ = j + 1;
  return true;
}

bool JsonCursor::plain_uint(std::uint64_t& out) {
  std::size_t j = i_;
  if (j >= s_.size() || s_[j] < '0' || s_[j] > '9') return false;
  std::uint64_t v = 0;
  if (s_[j] == '0') {
    ++j;
  } else {
    while (j < s_.size() && s_[j] >= '0' && s_[j] <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) ||
          __builtin_add_overflow(v, static_cast<std::uint64_t>(s_[j] - '0'), &v)) {
        return false;
      }
      ++j;
    }
  }
  if (j < s_.size() &&
      (s_[j] == '.' || s_[j] == 'e' || s_[j] == 'E' || (s_[j] >= '0' && s_[j] <= '9')))
    return false;
  out = v;
  i_ = j;
  return true;
}

void JsonCursor::number() {
  auto digits = [&] {
    const std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    return i_ > start;
  };
  eat('-');
  if (eat('0')) {
    if (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') fail("a number with a leading zero");
  } else if (!digits()) {
    fail("a number without digits");
  }
  if (eat('.') && !digits()) fail("a number without digits after its point");
  if (eat('e') || eat('E')) {
    if (!eat('+')) eat('-');
    if (!digits()) fail("a number without digits in its exponent");
  }
}

void JsonCursor::skip_value(int max_depth) {
  ws();
  if (at_end()) fail("a value is missing");
  std::string scratch;
  const char c = s_[i_];
  if (c == '{' || c == '[') {
    if (max_depth <= 0) throw JsonTooDeep();
    const bool object = c == '{';
    const char close = object ? '}' : ']';
    ++i_;
    ws();
    if (eat(close)) return;
    while (true) {
      ws();
      if (object) {
        string(scratch);
        ws();
        expect(':', "expected ':' after a key");
      }
      skip_value(max_depth - 1);
      ws();
      if (eat(',')) continue;
      if (eat(close)) return;
      fail(object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
    }
  }
  if (c == '"') return string(scratch);
  for (std::string_view word : {"true", "false", "null"}) {
    if (s_.substr(i_, word.size()) == word) {
      i_ += word.size();
      return;
    }
  }
  if (c == '-' || (c >= '0' && c <= '9')) return number();
  fail("an unexpected character where a value should be");
}

namespace {

// nlohmann's DOM built from SAX events: what its own DOM parser does, plus the checks. (Its
// callback parser can check too, but rescans an object after each object inside it: quadratic.)
class StrictBuilder : public nlohmann::json_sax<nlohmann::json> {
 public:
  using json = nlohmann::json;
  StrictBuilder(int max_depth, const std::function<void(const std::string&, int)>& on_duplicate,
                const std::function<void()>& on_too_deep,
                const std::function<void(const std::string&)>& on_syntax)
      : max_depth_(max_depth),
        on_duplicate_(on_duplicate),
        on_too_deep_(on_too_deep),
        on_syntax_(on_syntax) {}
  json take() { return std::move(root_); }

  bool null() override { return add(json(nullptr)); }
  bool boolean(bool v) override { return add(json(v)); }
  bool number_integer(number_integer_t v) override { return add(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return add(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return add(json(v)); }
  bool string(string_t& v) override { return add(json(std::move(v))); }
  bool binary(binary_t&) override { return add(json()); }  // JSON text has no binary values
  bool start_object(std::size_t) override { return open(json::object()); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (stack_.back()->contains(k)) on_duplicate_(k, static_cast<int>(stack_.size()));
    key_ = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    on_syntax_(e.what());
    return false;
  }

 private:
  bool open(json container) {
    if (stack_.size() >= static_cast<std::size_t>(max_depth_)) on_too_deep_();
    stack_.push_back(add_value(std::move(container)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  bool add(json v) {
    add_value(std::move(v));
    return true;
  }
  json* add_value(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    return &(parent[key_] = std::move(v));
  }

  int max_depth_;
  const std::function<void(const std::string&, int)>& on_duplicate_;
  const std::function<void()>& on_too_deep_;
  const std::function<void(const std::string&)>& on_syntax_;
  json root_;
  std::string key_;
  std::vector<json*> stack_;
};

class NullSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::string message;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_object() override { return true; }
  bool end_array() override { return true; }
  bool key(string_t&) override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    message = e.what();
    return false;
  }
};

}  // namespace

nlohmann::json parse_strict(std::string_view text, int max_depth,
                            const std::function<void(const std::string&, int)>& on_duplicate,
                            const std::function<void()>& on_too_deep,
                            const std::function<void(const std::string&)>& on_syntax) {
  // nlohmann's lexer takes a NUL byte for the end of the text; JSON allows none anywhere.
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
    on_syntax(fmt::format("a NUL byte at offset {}", nul));
  }
  StrictBuilder builder(max_depth, on_duplicate, on_too_deep, on_syntax);
  nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  return builder.take();
}

std::string nlohmann_syntax_message(std::string_view text) {
  NullSax sax;
  nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  return sax.message;
}

}  // namespace ferry::checkpoint
