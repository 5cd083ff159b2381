// Saving checkpoints from GPU memory (and GPU and host tensors in one file): the bytes in the file
// are the tensors' bytes, whatever memory they came from.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "checkpoint/safetensors_writer.h"
#include "ferry/ferry.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::TempDir;

class GpuSave : public ::testing::Test {
 protected:
  void SetUp() override {
    CudaStatus cuda = cuda_status();
    if (!cuda.available || cuda.gpus.empty()) {
      GTEST_SKIP() << "no GPU: " << (cuda.why_not.empty() ? "no device" : cuda.why_not);
    }
  }
};

LoadOptions host_load() {
  LoadOptions o;
  o.memory = MemoryKind::kHostPageable;
  return o;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_F(GpuSave, DeviceAndHostTensorsLandByteForByte) {
  TempDir dir;
  const std::size_t big = (9u << 20) + 3;  // several tasks, an odd tail
  const std::string a = test::pattern(big, 1), b = test::pattern(4096, 2),
                    h = test::pattern(100, 3);
  Buffer da(MemoryKind::kDevice, a.size(), 0), db(MemoryKind::kDevice, b.size(), 0);
  da.copy_from_host(a.data(), a.size());
  db.copy_from_host(b.data(), b.size());
  std::vector<TensorSource> tensors = {
      {"dev.a", Dtype::kU8, {a.size()}, da.data(), a.size()},
      {"dev.b", Dtype::kBF16, {b.size() / 2}, db.data(), b.size()},
      {"host.h", Dtype::kI8, {h.size()}, h.data(), h.size()},
  };
  SaveOptions o;
  o.metadata = std::map<std::string, std::string>{{"from", "gpu"}};
  SaveReport r = save_file(tensors, dir / "g.safetensors", o);
  EXPECT_EQ(r.routes.size(), 2u);  // one scattered write per kind of memory
  const SafetensorsLayout layout = safetensors_layout(tensors, o.metadata);
  // BF16 before I8 and U8 (I8 before U8 in safetensors' order).
  EXPECT_EQ(read_all(dir / "g.safetensors"), layout.header + b + h + a);
  Checkpoint ckpt(dir / "g.safetensors");
  LoadResult back = ckpt.load(host_load());
  for (const LoadedTensor& t : back.tensors) {
    const std::string got(static_cast<const char*>(t.data), t.nbytes);
    EXPECT_EQ(got, t.name == "dev.a" ? a : t.name == "dev.b" ? b : h) << t.name;
  }
}

TEST_F(GpuSave, ShardedSaveFromDeviceMemoryLoadsBack) {
  TempDir dir;
  std::vector<std::string> host;
  std::vector<Buffer> dev;
  std::vector<TensorSource> tensors;
  for (int i = 0; i < 6; ++i) {
    host.push_back(test::pattern(1 << 20, 10 + i));
    dev.emplace_back(MemoryKind::kDevice, host.back().size(), 0);
    dev.back().copy_from_host(host.back().data(), host.back().size());
    tensors.push_back({"w" + std::to_string(i),
                       Dtype::kF32,
                       {host.back().size() / 4},
                       dev.back().data(),
                       host.back().size()});
  }
  SaveOptions o;
  o.max_shard_size = 2 << 20;
  save_checkpoint(tensors, dir.path(), o);
  Checkpoint ckpt(dir.path());
  EXPECT_EQ(ckpt.shards().size(), 3u);
  LoadResult back = ckpt.load(host_load());
  for (const LoadedTensor& t : back.tensors) {
    const int i = std::stoi(t.name.substr(1));
    EXPECT_EQ(std::memcmp(t.data, host[i].data(), t.nbytes), 0) << t.name;
  }
}

}  // namespace
}  // namespace ferry
