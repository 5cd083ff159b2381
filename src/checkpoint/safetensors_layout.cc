// The safetensors header as safetensors 0.8 writes it (docs/checkpoints.md, "Saving"): the
// tensors' bytes ordered by the rank of their dtype in safetensors' own Dtype enum, highest first,
// then by name; the JSON written compactly with serde_json's escapes, "__metadata__" first, the
// tensors in the order of their bytes; spaces up to a multiple of 8.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <set>

#include "checkpoint/safetensors_header.h"
#include "ferry/checkpoint_writer.h"

namespace ferry {

namespace {

// safetensors' `enum Dtype` declaration order (safetensors/src/tensor.rs), whose derived Ord
// sorts the data section: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0,
// F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64.
int safetensors_rank(Dtype d) {
  switch (d) {
    case Dtype::kBool:
      return 0;
    case Dtype::kF4:
      return 1;
    case Dtype::kF6E2M3:
      return 2;
    case Dtype::kF6E3M2:
      return 3;
    case Dtype::kU8:
      return 4;
    case Dtype::kI8:
      return 5;
    case Dtype::kF8E5M2:
      return 6;
    case Dtype::kF8E4M3:
      return 7;
    case Dtype::kF8E8M0:
      return 8;
    case Dtype::kF8E4M3FNUZ:
      return 9;
    case Dtype::kF8E5M2FNUZ:
      return 10;
    case Dtype::kI16:
      return 11;
    case Dtype::kU16:
      return 12;
    case Dtype::kF16:
      return 13;
    case Dtype::kBF16:
      return 14;
    case Dtype::kI32:
      return 15;
    case Dtype::kU32:
      return 16;
    case Dtype::kF32:
      return 17;
    case Dtype::kC64:
      return 18;
    case Dtype::kF64:
      return 19;
    case Dtype::kI64:
      return 20;
    case Dtype::kU64:
      return 21;
  }
  return 0;
}

// A JSON string as serde_json writes it: `"` and `\` escaped, the control characters below 0x20
// as \b \t \n \f \r or \u00xx (lower-case hex), everything else (DEL, UTF-8) as it is.
void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out += kHex[u >> 4];
          out += kHex[u & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// shape x dtype bits / 8, or a CheckpointError naming the tensor (overflow, a packed kind that
// ends inside a byte).
std::uint64_t expected_bytes(const TensorSource& t, const std::string& file) {
  unsigned __int128 bits = dtype_bits(t.dtype);
  for (std::uint64_t d : t.shape) {
    bits *= d;
    if (bits > (static_cast<unsigned __int128>(UINT64_MAX) << 3)) {
      throw CheckpointError(file, t.name, "its shape overflows 64-bit byte counts");
    }
  }
  if (bits % 8 != 0) {
    throw CheckpointError(
        file, t.name,
        fmt::format("{} elements of {} do not fill whole bytes",
                    static_cast<std::uint64_t>(bits / dtype_bits(t.dtype)), to_string(t.dtype)));
  }
  return static_cast<std::uint64_t>(bits / 8);
}

}  // namespace

SafetensorsLayout safetensors_layout(
    std::span<const TensorSource> tensors,
    const std::optional<std::map<std::string, std::string>>& metadata, const std::string& file) {
  std::set<std::string_view> names;
  for (const TensorSource& t : tensors) {
    if (t.name == "__metadata__") {
      throw CheckpointError(file, t.name, "the name is reserved for the header's metadata");
    }
    if (!names.insert(t.name).second) {
      throw CheckpointError(file, t.name, "two tensors have this name");
    }
    const std::uint64_t want = expected_bytes(t, file);
    if (want != t.nbytes) {
      throw CheckpointError(file, t.name,
                            fmt::format("its shape and dtype ({}) make {} bytes, its memory holds "
                                        "{}",
                                        to_string(t.dtype), want, t.nbytes));
    }
    if (t.nbytes > 0 && t.data == nullptr) {
      throw CheckpointError(file, t.name, fmt::format("{} bytes at a null pointer", t.nbytes));
    }
  }
  SafetensorsLayout layout;
  layout.order.resize(tensors.size());
  std::iota(layout.order.begin(), layout.order.end(), std::size_t{0});
  std::sort(layout.order.begin(), layout.order.end(), [&](std::size_t a, std::size_t b) {
    const int ra = safetensors_rank(tensors[a].dtype), rb = safetensors_rank(tensors[b].dtype);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;  // byte-wise, as Rust's String order
  });

  std::string json = "{";
  if (metadata) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : *metadata) {
      if (!first) json += ',';
      first = false;
      append_json_string(json, key);
      json += ':';
      append_json_string(json, value);
    }
    json += '}';
  }
  std::vector<std::uint64_t> data_offset(tensors.size());
  std::uint64_t at = 0;
  for (std::size_t i : layout.order) {
    const TensorSource& t = tensors[i];
    if (json.size() > 1) json += ',';
    append_json_string(json, t.name);
    json += ":{\"dtype\":";
    append_json_string(json, to_string(t.dtype));
    json += ",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) json += ',';
      json += std::to_string(t.shape[d]);
    }
    json += fmt::format("],\"data_offsets\":[{},{}]}}", at, at + t.nbytes);
    data_offset[i] = at;
    at += t.nbytes;
  }
  json += '}';
  json.resize((json.size() + 7) / 8 * 8, ' ');
  if (json.size() > checkpoint::kMaxHeaderSize) {
    throw CheckpointError(file, "",
                          fmt::format("the header would be {} bytes; safetensors reads at most {}",
                                      json.size(), checkpoint::kMaxHeaderSize));
  }
  const std::uint64_t n = json.size();
  layout.header.resize(checkpoint::kLengthFieldSize);
  for (std::size_t b = 0; b < checkpoint::kLengthFieldSize; ++b) {
    layout.header[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  }
  layout.header += json;
  layout.offset.resize(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    layout.offset[i] = layout.header.size() + data_offset[i];
  layout.file_size = layout.header.size() + at;
  return layout;
}

}  // namespace ferry
