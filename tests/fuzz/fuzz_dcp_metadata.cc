// Fuzzes DCP's `.metadata` parser (checkpoint::parse_dcp_metadata, and under it the restricted
// unpickler read_pickle with DCP's allow-list): the input is the file. Every failure must be a
// CheckpointError naming the file; every success must list each tensor once, each of its chunks
// with a place in a .distcp file.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "checkpoint/dcp_metadata.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ferry::checkpoint::DcpMetadata md;
  try {
    md = ferry::checkpoint::parse_dcp_metadata(bytes, "fuzz.metadata");
  } catch (const ferry::CheckpointError& e) {
    FUZZ_CHECK(e.file() == "fuzz.metadata");
    FUZZ_CHECK(std::string_view(e.what()).find("fuzz.metadata") != std::string_view::npos);
    return 0;
  }
  std::set<std::string> names;
  for (const auto& t : md.tensors) {
    FUZZ_CHECK(names.insert(t.name).second);
    for (const auto& c : t.chunks) FUZZ_CHECK(!c.relative_path.empty());
  }
  return 0;
}
