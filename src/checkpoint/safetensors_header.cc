#include "checkpoint/safetensors_header.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <set>

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

const DtypeName& entry(Dtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  return kDtypes[1];  // unreachable: every enumerator is in the table
}

std::string with_context(const std::string& file, const std::string& tensor,
                         const std::string& message) {
  if (tensor.empty()) return fmt::format("safetensors {}: {}", file, message);
  return fmt::format("safetensors {}: tensor '{}': {}", file, tensor, message);
}

}  // namespace

std::string_view to_string(Dtype dtype) { return entry(dtype).name; }
unsigned dtype_bits(Dtype dtype) { return entry(dtype).bits; }

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

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string dtype_list() {
  std::string out;
  for (const auto& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

// The JSON, parsed with every object's keys checked for duplicates (nlohmann would keep the last
// silently) and nesting held to what the format uses, so a hostile header cannot build deep trees.
json parse_json(std::string_view text, const std::string& file) {
  std::vector<std::set<std::string>> keys;
  auto check = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth > 2) throw CheckpointError(file, "", "header nests deeper than the format does");
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(key).second) {
          throw CheckpointError(file, depth == 1 ? key : "",
                                fmt::format("the header names \"{}\" twice", key));
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {
    throw CheckpointError(file, "", fmt::format("header is not valid JSON: {}", e.what()));
  }
}

std::uint64_t unsigned_value(const json& v, const std::string& file, const std::string& tensor,
                             const char* field) {
  if (!v.is_number_unsigned()) {
    throw CheckpointError(file, tensor,
                          fmt::format("{} holds {}, not a non-negative integer", field, v.dump()));
  }
  return v.get<std::uint64_t>();
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
  if (t.end < t.begin) {
    throw CheckpointError(
        file, name, fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end));
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

// The ranges, in file order, must tile the data section: no overlap, no hole (the format forbids
// holes, so a file cannot hide other content), nothing after the last tensor.
void check_layout(std::vector<HeaderTensor>& tensors, std::uint64_t data_size,
                  const std::string& file) {
  std::sort(tensors.begin(), tensors.end(), [](const HeaderTensor& a, const HeaderTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
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
  if (n > kMaxHeaderSize) {
    throw CheckpointError(
        file, "", fmt::format("header length {} is above the {} B limit", n, kMaxHeaderSize));
  }
  if (n > file_size - kLengthFieldSize) {
    throw CheckpointError(
        file, "",
        fmt::format("header length {} runs past the end of the file ({} B)", n, file_size));
  }
  return n;
}

SafetensorsHeader parse_header(std::string_view text, std::uint64_t file_size,
                               const std::string& file) {
  if (text.empty() || text.front() != '{') {
    throw CheckpointError(file, "", "header does not start with '{'");
  }
  const json doc = parse_json(text, file);
  if (!doc.is_object()) throw CheckpointError(file, "", "header is not a JSON object");
  SafetensorsHeader h;
  h.header_size = text.size();
  h.data_start = kLengthFieldSize + text.size();
  if (h.data_start > file_size) {
    throw CheckpointError(file, "", fmt::format("header ends past the file ({} B)", file_size));
  }
  for (const auto& [name, value] : doc.items()) {
    if (name == "__metadata__") {
      h.metadata = parse_metadata(value, file);
    } else {
      h.tensors.push_back(parse_tensor(name, value, file));
    }
  }
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
