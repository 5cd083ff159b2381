// Fuzzes the torch.save blob reader (checkpoint::read_torch_save_tensor: the zip's end records,
// central directory and local headers, and data.pkl through the restricted unpickler with
// torch.save's allow-list): the input is one blob, the whole file. Every failure must be a
// CheckpointError naming the file; every success must locate storage bytes inside the blob.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "checkpoint/torch_save_blob.h"
#include "ferry/checkpoint.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ferry::checkpoint::TorchTensorRecord r;
  try {
    r = ferry::checkpoint::read_torch_save_tensor(
        [&](std::uint64_t at, std::uint64_t n) {
          FUZZ_CHECK(at <= size && n <= size - at);  // the reader stays inside the blob
          return bytes.substr(at, n);
        },
        0, size, "fuzz.distcp");
  } catch (const ferry::CheckpointError& e) {
    FUZZ_CHECK(e.file() == "fuzz.distcp");
    FUZZ_CHECK(std::string_view(e.what()).find("fuzz.distcp") != std::string_view::npos);
    return 0;
  }
  FUZZ_CHECK(r.data_offset <= size && r.data_length <= size - r.data_offset);
  FUZZ_CHECK(r.size.size() == r.stride.size());
  return 0;
}
