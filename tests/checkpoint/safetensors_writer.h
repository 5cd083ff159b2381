// The tests' own safetensors writer, built from the format description alone (8-byte
// little-endian header length, a JSON header, then the data), so that the parser is checked
// against an independent producer. The JSON is assembled by hand, not by the parser's library.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace ferry::test {

struct WrittenTensor {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::string bytes;
};

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The header of `tensors`, laid out one after another in the order given.
inline std::string header_json(const std::vector<WrittenTensor>& tensors,
                               const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (std::size_t i = 0; i < metadata.size(); ++i) {
      h += (i ? "," : "") + json_string(metadata[i].first) + ":" + json_string(metadata[i].second);
    }
    h += "}";
  }
  std::uint64_t offset = 0;
  for (const WrittenTensor& t : tensors) {
    if (h.size() > 1) h += ",";
    h += json_string(t.name) + ":{\"dtype\":" + json_string(t.dtype) + ",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      h += (i ? "," : "") + std::to_string(t.shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," +
         std::to_string(offset + t.bytes.size()) + "]}";
    offset += t.bytes.size();
  }
  return h + "}";
}

// Length field + header (space-padded to a multiple of 8, as the reference writer does) + data.
inline std::string file_bytes(const std::string& header, const std::string& data) {
  std::string h = header;
  while (h.size() % 8 != 0) h += ' ';
  std::string out(8, '\0');
  std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + data;
}

inline std::string safetensors_bytes(
    const std::vector<WrittenTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata = {}) {
  std::string data;
  for (const WrittenTensor& t : tensors) data += t.bytes;
  return file_bytes(header_json(tensors, metadata), data);
}

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Deterministic bytes that differ from tensor to tensor.
inline std::string pattern(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (char& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

}  // namespace ferry::test
