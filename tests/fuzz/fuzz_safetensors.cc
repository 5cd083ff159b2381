// Fuzzes the safetensors header parser (checkpoint::parse_file_prefix) over whole files: the
// input is the file. Every failure must be a CheckpointError naming the file; every success must
// describe the bytes exactly: known dtypes, shape x dtype size = range, ranges in file order
// tiling the data section, names unique.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "checkpoint/safetensors_header.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ferry::checkpoint::SafetensorsHeader h;
  try {
    h = ferry::checkpoint::parse_file_prefix(bytes, size, "fuzz.safetensors");
  } catch (const ferry::CheckpointError& e) {
    FUZZ_CHECK(e.file() == "fuzz.safetensors");
    FUZZ_CHECK(std::string_view(e.what()).find("fuzz.safetensors") != std::string_view::npos);
    return 0;
  }
  FUZZ_CHECK(h.data_start == 8 + h.header_size && h.data_start <= size);
  FUZZ_CHECK(h.header_size <= ferry::checkpoint::kMaxHeaderSize);
  std::uint64_t cursor = 0;
  std::set<std::string> names;
  for (const auto& t : h.tensors) {
    FUZZ_CHECK(names.insert(t.name).second);
    FUZZ_CHECK(ferry::parse_dtype(ferry::to_string(t.dtype)) == t.dtype);
    FUZZ_CHECK(t.begin == cursor && t.end >= t.begin);
    unsigned __int128 bits = ferry::dtype_bits(t.dtype);
    for (std::uint64_t extent : t.shape) {
      bits *= extent;
      if (bits > (static_cast<unsigned __int128>(1) << 67)) break;
    }
    FUZZ_CHECK(bits % 8 == 0 && bits / 8 == t.end - t.begin);
    cursor = t.end;
  }
  FUZZ_CHECK(cursor == size - h.data_start);
  return 0;
}
