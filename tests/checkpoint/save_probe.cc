// A small program that saves one generation of a test checkpoint, for the save tests that need a
// child process: faults injected by save_fault_shim (LD_PRELOAD), another user (setpriv), or two
// writers at once.
//   save_probe checkpoint DIR GEN SHARDS   save_checkpoint of generation GEN in SHARDS shards
//   save_probe file PATH GEN               save_file of generation GEN
//   save_probe dcp DIR GEN                 a DCP save of generation GEN by two ranks in turn
//                                          (t0..t2 and a byte item; t3..t5), then its commit
// Generation GEN: tensors t0..t5, 64 bytes each, every byte of t<i> is GEN * 16 + i.
// Exit codes: 0 saved, 4 a ferry::Error (its message printed), 2 usage.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/dcp_metadata_pickle.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/dcp_writer.h"
#include "ferry/error.h"

namespace {

constexpr int kTensors = 6;
constexpr std::uint64_t kBytes = 64;

struct Generation {
  std::vector<std::string> bytes;
  std::vector<ferry::TensorSource> tensors;
  explicit Generation(int gen) {
    bytes.reserve(kTensors);
    for (int i = 0; i < kTensors; ++i) {
      bytes.emplace_back(kBytes, static_cast<char>(gen * 16 + i));
      tensors.push_back(
          {"t" + std::to_string(i), ferry::Dtype::kU8, {kBytes}, bytes.back().data(), kBytes});
    }
  }
};

// Both ranks' files under names of this save, then .metadata naming them.
void save_dcp(const Generation& g, const std::string& dir, int gen) {
  const ferry::DcpSaveLock lock(dir, true);
  std::vector<ferry::test::DcpEntry> entries;
  std::vector<std::string> files;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = "__" + std::to_string(rank) + "_0." + std::to_string(gen) + "-" +
                             std::to_string(::getpid()) + ".distcp";
    std::vector<ferry::DcpWriteItem> items;
    for (int i = rank * 3; i < rank * 3 + 3; ++i) items.push_back({g.tensors[i], false, ""});
    if (rank == 0) {
      ferry::DcpWriteItem step;
      step.tensor.name = "step";
      step.is_bytes = true;
      step.bytes = "generation " + std::to_string(gen);
      items.push_back(step);
    }
    const auto places = ferry::write_dcp_file(items, dir + "/" + file);
    for (std::size_t k = 0; k < items.size(); ++k) {
      const bool bytes = items[k].is_bytes;
      entries.push_back({bytes ? "step" : items[k].tensor.name,
                         bytes ? "" : "uint8",
                         {kBytes},
                         file,
                         places[k].offset,
                         places[k].length});
    }
    files.push_back(file);
  }
  ferry::commit_dcp_metadata(dir, ferry::test::dcp_metadata_pickle(entries), files);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  try {
    if (what == "checkpoint" && argc == 5) {
      const Generation g(std::atoi(argv[3]));
      const int shards = std::atoi(argv[4]);
      ferry::SaveOptions o;
      o.max_shard_size = shards <= 1 ? 0 : kBytes * ((kTensors + shards - 1) / shards);
      ferry::save_checkpoint(g.tensors, argv[2], o);
      return 0;
    }
    if (what == "dcp" && argc == 4) {
      const Generation g(std::atoi(argv[3]));
      save_dcp(g, argv[2], std::atoi(argv[3]));
      return 0;
    }
    if (what == "file" && argc == 4) {
      const Generation g(std::atoi(argv[3]));
      ferry::save_file(g.tensors, argv[2]);
      return 0;
    }
  } catch (const ferry::Error& e) {
    std::printf("%s\n", e.what());
    return 4;
  }
  std::fprintf(stderr,
               "usage: save_probe checkpoint DIR GEN SHARDS | file PATH GEN | dcp DIR GEN\n");
  return 2;
}
