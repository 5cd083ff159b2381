#include "checkpoint/safetensors_header.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/json_scan.h"
#include "ferry/printable.h"

namespace ferry {

namespace {

struct DtypeName {
  Dtype dtype;
  std::string_view name;
  unsigned bits;
};

constexpr std::array<DtypeName, 22> kDtypes = {{
    {Dtype::kBool, "BOOL", 8},
    {Dtype::kU8, "U8", 8},
    {Dtype::kI8, "I8", 8},
    {Dtype::kU16, "U16", 16},
    {Dtype::kI16, "I16", 16},
    {Dtype::kF16, "F16", 16},
    {Dtype::kBF16, "BF16", 16},
    {Dtype::kU32, "U32", 32},
    {Dtype::kI32, "I32", 32},
    {Dtype::kF32, "F32", 32},
    {Dtype::kU64, "U64", 64},
    {Dtype::kI64, "I64", 64},
    {Dtype::kF64, "F64", 64},
    {Dtype::kC64, "C64", 64},
    {Dtype::kF8E4M3, "F8_E4M3", 8},
    {Dtype::kF8E5M2, "F8_E5M2", 8},
    {Dtype::kF8E8M0, "F8_E8M0", 8},
    {Dtype::kF6E2M3, "F6_E2M3", 6},
    {Dtype::kF6E3M2, "F6_E3M2", 6},
    {Dtype::kF4, "F4", 4},
    {Dtype::kF8E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {Dtype::kF8E5M2FNUZ, "F8_E5M2FNUZ", 8},
}};

// The table is in the enumeration's order, so a dtype is its own index.
constexpr bool in_enum_order() {
  for (std::size_t i = 0; i < kDtypes.size(); ++i) {
    if (kDtypes[i].dtype != static_cast<Dtype>(i)) return false;
  }
  return true;
}
static_assert(in_enum_order());

constexpr std::array<Dtype, kDtypes.size()> kAllDtypes = [] {
  std::array<Dtype, kDtypes.size()> out{};
  for (std::size_t i = 0; i < kDtypes.size(); ++i) out[i] = kDtypes[i].dtype;
  return out;
}();

const DtypeName& entry(Dtype dtype) { return kDtypes.at(static_cast<std::size_t>(dtype)); }

std::string with_context(const std::string& file, const std::string& tensor,
                         const std::string& message) {
  // Names and JSON text come from the file: escaped, so no terminal escape or stray byte prints.
  const std::string_view format =
      file.ends_with(".metadata") || file.ends_with(".distcp") ? "dcp" : "safetensors";
  if (tensor.empty()) return printable(fmt::format("{} {}: {}", format, file, message));
  return printable(fmt::format("{} {}: tensor '{}': {}", format, file, tensor, message));
}

}  // namespace

std::string_view to_string(Dtype dtype) { return entry(dtype).name; }
unsigned dtype_bits(Dtype dtype) { return entry(dtype).bits; }
std::span<const Dtype> all_dtypes() { return kAllDtypes; }

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const auto& d : kDtypes) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

CheckpointError::CheckpointError(std::string file, std::string tensor, const std::string& message)
    : Error(with_context(file, tensor, message)),
      file_(std::move(file)),
      tensor_(std::move(tensor)) {}

namespace checkpoint {

namespace {

using nlohmann::json;

constexpr std::uint64_t kMaxElements = INT64_MAX;

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string dtype_list() {
  std::string out;
  for (const auto& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

std::uint64_t unsigned_value(const json& v, const std::string& file, const std::string& tensor,
                             const char* field) {
  if (!v.is_number_unsigned()) {
    throw CheckpointError(file, tensor,
                          fmt::format("{} holds {}, not a non-negative integer", field, v.dump()));
  }
  return v.get<std::uint64_t>();
}

// The checks on a tensor's numbers: a range that ends before it begins, a shape past int64, a
// size that overflows or is not whole bytes, a size that differs from the range.
void check_tensor(const HeaderTensor& t, const std::string& file) {
  const std::string& name = t.name;
  if (t.end < t.begin) {
    throw CheckpointError(
        file, name, fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end));
  }
  // Frameworks hold extents and element counts in int64: a shape past that is refused even when
  // a zero extent makes it empty (torch fails on [0, 2**62, 2**62] with an unrelated error).
  std::uint64_t elements = 1;
  for (std::uint64_t extent : t.shape) {
    if (extent == 0) continue;
    if (__builtin_mul_overflow(elements, extent, &elements) || elements > kMaxElements) {
      throw CheckpointError(file, name,
                            fmt::format("shape {} overflows 2**63 - 1 elements (its extents "
                                        "other than 0 multiplied)",
                                        shape_text(t.shape)));
    }
  }
  // elements x bits / 8, refusing overflow and a packed kind that does not fill whole bytes.
  std::uint64_t bits = dtype_bits(t.dtype);
  for (std::uint64_t extent : t.shape) {
    if (__builtin_mul_overflow(bits, extent, &bits)) {
      throw CheckpointError(file, name,
                            fmt::format("shape {} overflows 64 bits of size", shape_text(t.shape)));
    }
  }
  if (bits % 8 != 0) {
    throw CheckpointError(file, name,
                          fmt::format("shape {} of {} is not a whole number of bytes",
                                      shape_text(t.shape), to_string(t.dtype)));
  }
  if (bits / 8 != t.end - t.begin) {
    throw CheckpointError(file, name,
                          fmt::format("shape {} of {} is {} B but data_offsets [{}, {}] hold {} B",
                                      shape_text(t.shape), to_string(t.dtype), bits / 8, t.begin,
                                      t.end, t.end - t.begin));
  }
}

HeaderTensor parse_tensor(const std::string& name, const json& v, const std::string& file) {
  if (!v.is_object()) {
    throw CheckpointError(file, name, fmt::format("entry is {}, not an object", v.type_name()));
  }
  for (const auto& [key, _] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      throw CheckpointError(file, name, fmt::format("unknown field \"{}\"", key));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(field)) throw CheckpointError(file, name, fmt::format("no \"{}\"", field));
  }
  HeaderTensor t;
  t.name = name;
  const json& dtype = v["dtype"];
  std::optional<Dtype> parsed =
      dtype.is_string() ? parse_dtype(dtype.get_ref<const std::string&>()) : std::nullopt;
  if (!parsed) {
    throw CheckpointError(file, name,
                          fmt::format("unknown dtype {} (known: {})", dtype.dump(), dtype_list()));
  }
  t.dtype = *parsed;
  const json& shape = v["shape"];
  if (!shape.is_array()) throw CheckpointError(file, name, "shape is not an array");
  for (const json& extent : shape) t.shape.push_back(unsigned_value(extent, file, name, "shape"));
  const json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    throw CheckpointError(file, name,
                          fmt::format("data_offsets {} is not [begin, end]", offsets.dump()));
  }
  t.begin = unsigned_value(offsets[0], file, name, "data_offsets");
  t.end = unsigned_value(offsets[1], file, name, "data_offsets");
  check_tensor(t, file);
  return t;
}

std::map<std::string, std::string> parse_metadata(const json& v, const std::string& file) {
  std::map<std::string, std::string> out;
  if (v.is_null()) return out;
  if (!v.is_object()) throw CheckpointError(file, "", "__metadata__ is not an object");
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      throw CheckpointError(
          file, "", fmt::format("__metadata__ \"{}\" is {}, not a string", key, value.type_name()));
    }
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// The common form of a tensor entry, read straight from the text: an object of exactly
// "dtype" (a known name), "shape" and "data_offsets" (plain unsigned integers), in any order.
// Anything else (an unknown field or dtype, a negative or fractional number, an escape, a
// duplicate field) returns nullopt with the cursor unmoved, and the entry is read again the slow
// way, which has the exact message for each fault.
std::optional<HeaderTensor> fast_tensor(JsonCursor& c, const std::string& name) {
  const std::size_t start = c.pos();
  auto give_up = [&] {
    c.set_pos(start);
    return std::nullopt;
  };
  HeaderTensor t;
  unsigned seen = 0;
  if (!c.eat('{')) return give_up();
  do {
    c.ws();
    std::string_view key;
    if (!c.plain_string(key)) return give_up();
    c.ws();
    if (!c.eat(':')) return give_up();
    c.ws();
    if (key == "dtype" && !(seen & 1)) {
      std::string_view dtype;
      if (!c.plain_string(dtype)) return give_up();
      std::optional<Dtype> parsed = parse_dtype(dtype);
      if (!parsed) return give_up();
      t.dtype = *parsed;
      seen |= 1;
    } else if (key == "shape" && !(seen & 2)) {
      if (!c.eat('[')) return give_up();
      c.ws();
      if (!c.eat(']')) {
        do {
          c.ws();
          std::uint64_t extent = 0;
          if (!c.plain_uint(extent)) return give_up();
          t.shape.push_back(extent);
          c.ws();
        } while (c.eat(','));
        if (!c.eat(']')) return give_up();
      }
      seen |= 2;
    } else if (key == "data_offsets" && !(seen & 4)) {
      if (!c.eat('[')) return give_up();
      c.ws();
      if (!c.plain_uint(t.begin)) return give_up();
      c.ws();
      if (!c.eat(',')) return give_up();
      c.ws();
      if (!c.plain_uint(t.end)) return give_up();
      c.ws();
      if (!c.eat(']')) return give_up();
      seen |= 4;
    } else {
      return give_up();
    }
    c.ws();
  } while (c.eat(','));
  if (!c.eat('}') || seen != 7) return give_up();
  t.name = name;
  return t;
}

// The ranges, in file order, must tile the data section: no overlap, no hole (the format forbids
// holes, so a file cannot hide other content), nothing after the last tensor.
void check_layout(std::vector<HeaderTensor>& tensors, std::uint64_t data_size,
                  const std::string& file) {
  auto file_order = [](const HeaderTensor& a, const HeaderTensor& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end != b.end ? a.end < b.end : a.name < b.name;
  };
  // Writers list tensors in file order: then there is nothing to sort.
  if (!std::is_sorted(tensors.begin(), tensors.end(), file_order)) {
    std::sort(tensors.begin(), tensors.end(), file_order);
  }
  std::uint64_t cursor = 0;
  const HeaderTensor* previous = nullptr;
  for (const HeaderTensor& t : tensors) {
    if (t.begin < cursor) {
      throw CheckpointError(file, t.name,
                            fmt::format("bytes [{}, {}) overlap tensor '{}' (ends at {})", t.begin,
                                        t.end, previous->name, cursor));
    }
    if (t.begin > cursor) {
      throw CheckpointError(file, t.name,
                            fmt::format("bytes [{}, {}) leave a hole [{}, {}) in the data section",
                                        t.begin, t.end, cursor, t.begin));
    }
    if (t.end > data_size) {
      throw CheckpointError(file, t.name,
                            fmt::format("bytes [{}, {}) run past the data section ({} B)", t.begin,
                                        t.end, data_size));
    }
    cursor = t.end;
    previous = &t;
  }
  if (cursor != data_size) {
    throw CheckpointError(
        file, "",
        fmt::format("the tensors end at {} but the data section holds {} B", cursor, data_size));
  }
}

}  // namespace

std::uint64_t header_length(std::string_view first8, std::uint64_t file_size,
                            const std::string& file) {
  if (first8.size() < kLengthFieldSize || file_size < kLengthFieldSize) {
    throw CheckpointError(file, "",
                          fmt::format("{} B is too short for the 8-byte header length", file_size));
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(first8[i]);
  // The length itself is not printed: for a file that is not a safetensors file it is the
  // file's first 8 bytes, which an error message must not reveal.
  if (n > kMaxHeaderSize) {
    throw CheckpointError(file, "",
                          fmt::format("the header length is above the {} B limit: not a "
                                      "safetensors file",
                                      kMaxHeaderSize));
  }
  if (n > file_size - kLengthFieldSize) {
    throw CheckpointError(
        file, "", fmt::format("the header length runs past the end of the file ({} B)", file_size));
  }
  return n;
}

// One pass over the text (nlohmann's callback parser rescanned the top-level object after each
// tensor: 40,000 tensors took 28.6 s). Tensor entries of the usual form are read straight from
// the text; any other entry (and __metadata__) is validated by the cursor, then built as a small
// nlohmann value and checked by the same functions as before. A fault in an entry is remembered
// and thrown once the whole text has proved to be JSON, so a syntax error anywhere comes first.
SafetensorsHeader parse_header(std::string_view text, std::uint64_t file_size,
                               const std::string& file) {
  if (text.empty() || text.front() != '{') {
    throw CheckpointError(file, "", "header does not start with '{'");
  }
  // JSON allows no NUL byte anywhere (nor do Python's json and the serde_json that safetensors
  // uses); nlohmann's lexer took one for the end of the text, so `{...}\0<anything>` passed.
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
    throw CheckpointError(file, "",
                          fmt::format("header is not valid JSON: a NUL byte at offset {}", nul));
  }
  SafetensorsHeader h;
  h.header_size = text.size();
  h.data_start = kLengthFieldSize + text.size();
  if (h.data_start > file_size) {
    throw CheckpointError(file, "", fmt::format("header ends past the file ({} B)", file_size));
  }
  std::exception_ptr first_error;
  auto keep_first = [&](auto&& check) {
    if (first_error) return;
    try {
      check();
    } catch (const CheckpointError&) {
      first_error = std::current_exception();
    }
  };
  auto syntax = [&](const std::string& message) -> void {
    throw CheckpointError(file, "", fmt::format("header is not valid JSON: {}", message));
  };
  std::size_t metadata_entries = 0;
  try {
    JsonCursor c(text);
    c.expect('{', "expected '{'");
    c.ws();
    if (!c.eat('}')) {
      std::string name;
      do {
        c.ws();
        c.string(name);
        c.ws();
        c.expect(':', "expected ':' after a key");
        c.ws();
        if (name != "__metadata__") {
          if (std::optional<HeaderTensor> t = fast_tensor(c, name)) {
            keep_first([&] { check_tensor(*t, file); });
            h.tensors.push_back(std::move(*t));
            c.ws();
            continue;
          }
        } else {
          ++metadata_entries;
        }
        const std::size_t start = c.pos();
        try {
          c.skip_value(2);  // an entry (1) and the arrays inside it (2), as the format has
        } catch (const JsonTooDeep&) {
          throw CheckpointError(file, "", "header nests deeper than the format does");
        }
        const json value = parse_strict(
            text.substr(start, c.pos() - start), 2,
            [&](const std::string& key, int) {
              throw CheckpointError(file, "", fmt::format("the header names \"{}\" twice", key));
            },
            [&] { throw CheckpointError(file, "", "header nests deeper than the format does"); },
            syntax);
        if (name == "__metadata__") {
          keep_first([&] { h.metadata = parse_metadata(value, file); });
        } else {
          keep_first([&] { h.tensors.push_back(parse_tensor(name, value, file)); });
        }
        c.ws();
      } while (c.eat(','));
      c.expect('}', "expected ',' or '}' after an entry");
    }
    // Trailing whitespace is valid (safetensors pads its header with spaces); nothing else is.
    c.ws();
    if (!c.at_end()) c.fail("text after the header's object");
  } catch (const JsonSyntaxError& e) {
    // nlohmann's wording where it sees the fault too.
    const std::string theirs = nlohmann_syntax_message(text);
    syntax(theirs.empty() ? e.what() : theirs);
  }
  // Names must be unique: nlohmann would have kept the last one silently.
  if (metadata_entries > 1) {
    throw CheckpointError(file, "__metadata__", "the header names \"__metadata__\" twice");
  }
  // (Sorting pointers measured faster than a hash set of 1 M names; writers often list names
  // sorted already, and then there is nothing to sort.)
  std::vector<const std::string*> names;
  names.reserve(h.tensors.size());
  for (const HeaderTensor& t : h.tensors) names.push_back(&t.name);
  auto by_name = [](const std::string* a, const std::string* b) { return *a < *b; };
  if (!std::is_sorted(names.begin(), names.end(), by_name)) {
    std::sort(names.begin(), names.end(), by_name);
  }
  auto twice =
      std::adjacent_find(names.begin(), names.end(),
                         [](const std::string* a, const std::string* b) { return *a == *b; });
  if (twice != names.end()) {
    throw CheckpointError(file, **twice, fmt::format("the header names \"{}\" twice", **twice));
  }
  if (first_error) std::rethrow_exception(first_error);
  check_layout(h.tensors, file_size - h.data_start, file);
  return h;
}

SafetensorsHeader parse_file_prefix(std::string_view prefix, std::uint64_t file_size,
                                    const std::string& file) {
  std::uint64_t n = header_length(prefix, file_size, file);
  if (prefix.size() < kLengthFieldSize + n) {
    throw CheckpointError(file, "", "the header was cut short");
  }
  return parse_header(prefix.substr(kLengthFieldSize, n), file_size, file);
}

}  // namespace checkpoint
}  // namespace ferry

namespace ferry {

SafetensorsContents parse_safetensors(std::string_view bytes, const std::string& name) {
  checkpoint::SafetensorsHeader h = checkpoint::parse_file_prefix(bytes, bytes.size(), name);
  SafetensorsContents out;
  out.metadata = std::move(h.metadata);
  for (checkpoint::HeaderTensor& t : h.tensors) {
    out.tensors.push_back({std::move(t.name), t.dtype, std::move(t.shape), h.data_start + t.begin,
                           t.end - t.begin, 0});
  }
  return out;
}

}  // namespace ferry
