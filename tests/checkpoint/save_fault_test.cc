// The save protocol of checkpoint folders under faults (docs/checkpoints.md, "Sharded saves"):
// a child process saves while save_fault_shim kills it (SIGKILL) or fails one call (EIO) at
// every step of the protocol in turn, and after each the folder must load as the whole old
// checkpoint or the whole new one, for ferry (the index) and for transformers (model.safetensors
// first), an error's words must match what the folder holds, and the next save must succeed and
// leave no temporary file. Also: two writers at once, a writer's lock keeping its temporary
// file, the parents of new folders synced, umask(2) never called.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "checkpoint/safetensors_writer.h"
#include "ferry/atomic_file.h"
#include "ferry/checkpoint.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/dcp_writer.h"
#include "reliability/subprocess.h"
#include "test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

constexpr int kMixed = -2;   // loads, but not as one whole generation
constexpr int kNoLoad = -1;  // refuses to load

// Which generation `path` (a folder or one file) loads as, as save_probe wrote it.
int generation_of(const fs::path& path, std::string* why = nullptr) {
  try {
    Checkpoint ckpt(path);
    LoadOptions lo;
    lo.memory = MemoryKind::kHostPageable;
    LoadResult loaded = ckpt.load(lo);
    if (loaded.tensors.size() != 6) return kMixed;
    int gen = -100;
    for (const LoadedTensor& t : loaded.tensors) {
      const auto* bytes = static_cast<const unsigned char*>(t.data);
      const int i = std::stoi(t.name.substr(1));
      const int g = (bytes[0] - i) / 16;
      if (gen == -100) gen = g;
      if (g != gen || t.nbytes != 64) return kMixed;
      for (std::size_t k = 0; k < t.nbytes; ++k) {
        if (bytes[k] != bytes[0]) return kMixed;
      }
    }
    return gen;
  } catch (const Error& e) {
    if (why != nullptr) *why = e.what();
    return kNoLoad;
  }
}

// What transformers' from_pretrained would load: model.safetensors first, else the index.
int transformers_generation(const fs::path& dir) {
  if (fs::exists(dir / "model.safetensors")) return generation_of(dir / "model.safetensors");
  return generation_of(dir);
}

test::ProcessResult probe(const std::vector<std::string>& args,
                          std::vector<std::pair<std::string, std::string>> env = {}) {
  std::vector<std::string> argv{FERRY_SAVE_PROBE};
  argv.insert(argv.end(), args.begin(), args.end());
  env.emplace_back("ASAN_OPTIONS", "verify_asan_link_order=0");
  return test::run_process(argv, env, 60);
}

test::ProcessResult probe_with_shim(const std::vector<std::string>& args, const std::string& fault,
                                    const std::string& count_file = "") {
  return probe(args, {{"LD_PRELOAD", FERRY_SAVE_FAULT_SHIM},
                      {"FERRY_FAULT", fault},
                      {"FERRY_FAULT_COUNT", count_file}});
}

std::map<std::string, long> counts_in(const fs::path& file) {
  std::map<std::string, long> counts;
  std::ifstream in(file);
  std::string op;
  long n = 0;
  while (in >> op >> n) counts[op] = n;
  return counts;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool holds_temporary_files(const fs::path& dir) {
  for (const std::string& name : names_in(dir)) {
    if (name.find(".ferry-") != std::string::npos) return true;
  }
  return false;
}

struct Scenario {
  const char* name;
  int old_shards;  // 0: no old checkpoint (a new folder); -1: a lone model.safetensors
  int new_shards;
};

void make_old(const fs::path& dir, const Scenario& s) {
  if (s.old_shards == 0) return;
  fs::create_directories(dir);
  const auto r = s.old_shards < 0
                     ? probe({"file", (dir / "model.safetensors").string(), "1"})
                     : probe({"checkpoint", dir.string(), "1", std::to_string(s.old_shards)});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  ASSERT_EQ(generation_of(dir), 1);
}

class SaveUnderFaults : public ::testing::TestWithParam<Scenario> {};

TEST_P(SaveUnderFaults, EveryStepKilledOrFailedLeavesTheOldCheckpointOrTheNewOneWhole) {
  const Scenario& s = GetParam();
  TempDir root;
  const fs::path dir = root / "ckpt" / "step";
  const std::vector<std::string> save{"checkpoint", dir.string(), "2",
                                      std::to_string(s.new_shards)};
  make_old(dir, s);
  const fs::path count_file = root / "counts";
  const auto clean = probe_with_shim(save, "pwrite:0:kill", count_file.string());
  ASSERT_EQ(clean.exit_code, 0) << clean.describe();
  ASSERT_EQ(generation_of(dir), 2);
  const std::map<std::string, long> counts = counts_in(count_file);
  EXPECT_EQ(counts.at("umask"), 0) << "umask(2) races with the other threads' file creations";
  int runs = 0;
  for (const auto& [op, count] : counts) {
    for (long n = 1; n <= count; ++n) {
      for (const char* action : {"kill", "EIO"}) {
        const std::string fault = op + ":" + std::to_string(n) + ":" + action;
        SCOPED_TRACE(fault);
        fs::remove_all(root / "ckpt");
        make_old(dir, s);
        const auto r = probe_with_shim(save, fault);
        ++runs;
        const int old_gen = s.old_shards == 0 ? kNoLoad : 1;
        std::string why;
        const int gen = fs::exists(dir) ? generation_of(dir, &why) : kNoLoad;
        EXPECT_TRUE(gen == old_gen || gen == 2)
            << "loads as " << gen << " " << why << "; " << r.describe();
        const int seen = fs::exists(dir) ? transformers_generation(dir) : kNoLoad;
        EXPECT_TRUE(seen == old_gen || seen == 2) << "transformers' view: " << seen;
        if (r.exited && r.exit_code == 0) {
          EXPECT_EQ(gen, 2) << r.describe();
          EXPECT_EQ(seen, 2) << "a save that reported success leaves the old weights visible";
        }
        if (r.exited && r.exit_code == 4) {
          if (r.output.find("unchanged") != std::string::npos) {
            EXPECT_EQ(gen, old_gen) << r.output;
          }
          if (r.output.find("already committed") != std::string::npos) {
            EXPECT_EQ(gen, 2) << r.output;
          }
        }
        // The next save tidies up and succeeds, whatever was left.
        const auto next = probe({"checkpoint", dir.string(), "3", "3"});
        ASSERT_EQ(next.exit_code, 0) << next.describe();
        EXPECT_EQ(generation_of(dir), 3);
        EXPECT_FALSE(holds_temporary_files(dir)) << testing::PrintToString(names_in(dir));
      }
    }
  }
  EXPECT_GT(runs, 20);
}

INSTANTIATE_TEST_SUITE_P(
    Folders, SaveUnderFaults,
    ::testing::Values(Scenario{"ResaveSameShardCount", 3, 3}, Scenario{"ResaveOtherCount", 3, 2},
                      Scenario{"SingleToSharded", 1, 3}, Scenario{"LoneFileToSharded", -1, 3},
                      Scenario{"SingleToSingle", 1, 1}, Scenario{"NewFolder", 0, 3}),
    [](const ::testing::TestParamInfo<Scenario>& p) { return std::string(p.param.name); });

std::size_t distcp_files_in(const fs::path& dir) {
  std::size_t n = 0;
  for (const std::string& name : names_in(dir)) n += name.ends_with(".distcp");
  return n;
}

// Issue 51 item 4: ferry's DCP writing core (two ranks' files, then the coordinator's .metadata
// rename) under the same walk of faults, over a new folder and over an old checkpoint.
TEST(DcpSaveUnderFaults, EveryStepKilledOrFailedLeavesTheOldCheckpointOrTheNewOneWhole) {
  for (const bool has_old : {false, true}) {
    SCOPED_TRACE(has_old ? "over an old checkpoint" : "into a new folder");
    TempDir root;
    const fs::path dir = root / "ckpt" / "step";
    auto make_old_dcp = [&] {
      if (!has_old) return;
      const auto r = probe({"dcp", dir.string(), "1"});
      ASSERT_EQ(r.exit_code, 0) << r.describe();
      ASSERT_EQ(generation_of(dir), 1);
    };
    make_old_dcp();
    const fs::path count_file = root / "counts";
    const auto clean =
        probe_with_shim({"dcp", dir.string(), "2"}, "pwrite:0:kill", count_file.string());
    ASSERT_EQ(clean.exit_code, 0) << clean.describe();
    ASSERT_EQ(generation_of(dir), 2);
    EXPECT_EQ(distcp_files_in(dir), 2u) << testing::PrintToString(names_in(dir));
    int runs = 0;
    for (const auto& [op, count] : counts_in(count_file)) {
      for (long n = 1; n <= count; ++n) {
        for (const char* action : {"kill", "EIO", "ENOSPC"}) {
          const std::string fault = op + ":" + std::to_string(n) + ":" + action;
          SCOPED_TRACE(fault);
          fs::remove_all(root / "ckpt");
          make_old_dcp();
          const auto r = probe_with_shim({"dcp", dir.string(), "2"}, fault);
          ++runs;
          const int old_gen = has_old ? 1 : kNoLoad;
          std::string why;
          const int gen = fs::exists(dir) ? generation_of(dir, &why) : kNoLoad;
          EXPECT_TRUE(gen == old_gen || gen == 2)
              << "loads as " << gen << " " << why << "; " << r.describe();
          if (r.exited && r.exit_code == 0) {
            EXPECT_EQ(gen, 2) << r.describe();
          }
          if (r.exited && r.exit_code == 4 &&
              r.output.find("already committed") != std::string::npos) {
            EXPECT_EQ(gen, 2) << r.output;
          }
          if (r.exited && r.exit_code == 4 &&
              r.output.find("already committed") == std::string::npos) {
            EXPECT_EQ(gen, old_gen) << r.output;
          }
          const auto next = probe({"dcp", dir.string(), "3"});
          ASSERT_EQ(next.exit_code, 0) << next.describe();
          EXPECT_EQ(generation_of(dir), 3);
          EXPECT_FALSE(holds_temporary_files(dir)) << testing::PrintToString(names_in(dir));
          EXPECT_EQ(distcp_files_in(dir), 2u) << testing::PrintToString(names_in(dir));
        }
      }
    }
    EXPECT_GT(runs, 20);
  }
}

TEST(DcpSave, ASecondWriterIsRefusedAndTheCheckpointLeftAsItWas) {
  TempDir dir;
  ASSERT_EQ(probe({"dcp", dir.path().string(), "1"}).exit_code, 0);
  const std::vector<std::string> before = names_in(dir.path());
  {
    const DcpSaveLock first(dir.path(), true);
    const auto r = probe({"dcp", dir.path().string(), "2"});
    EXPECT_EQ(r.exit_code, 4) << r.describe();
    EXPECT_NE(r.output.find(dir.path().string()), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("a second writer is refused"), std::string::npos) << r.output;
  }
  EXPECT_EQ(names_in(dir.path()), before);
  EXPECT_EQ(generation_of(dir.path()), 1);
  ASSERT_EQ(probe({"dcp", dir.path().string(), "2"}).exit_code, 0);
  EXPECT_EQ(generation_of(dir.path()), 2);
}

TEST(SaveCheckpoint, TwoWritersAtOnceLeaveOneWholeCheckpoint) {
  TempDir dir;
  for (int round = 0; round < 10; ++round) {
    test::ProcessResult a, b;
    std::thread other([&] { b = probe({"checkpoint", dir.path().string(), "2", "3"}); });
    a = probe({"checkpoint", dir.path().string(), "1", round % 2 ? "3" : "2"});
    other.join();
    ASSERT_EQ(a.exit_code, 0) << a.describe();
    ASSERT_EQ(b.exit_code, 0) << b.describe();
    const int gen = generation_of(dir.path());
    EXPECT_TRUE(gen == 1 || gen == 2) << gen;
    EXPECT_FALSE(holds_temporary_files(dir.path())) << testing::PrintToString(names_in(dir.path()));
  }
}

TEST(SaveCheckpoint, TwoThreadsSavingIntoOneFolderTakeTurns) {
  TempDir dir;
  std::vector<std::string> bytes(12, std::string(64, 'a'));
  std::vector<TensorSource> first, second;
  for (int i = 0; i < 6; ++i) {
    bytes[i].assign(64, static_cast<char>(16 + i));
    bytes[6 + i].assign(64, static_cast<char>(32 + i));
    first.push_back({"t" + std::to_string(i), Dtype::kU8, {64}, bytes[i].data(), 64});
    second.push_back({"t" + std::to_string(i), Dtype::kU8, {64}, bytes[6 + i].data(), 64});
  }
  SaveOptions o;
  o.max_shard_size = 128;
  for (int round = 0; round < 20; ++round) {
    std::thread t([&] { save_checkpoint(second, dir.path(), o); });
    save_checkpoint(first, dir.path(), o);
    t.join();
    const int gen = generation_of(dir.path());
    EXPECT_TRUE(gen == 1 || gen == 2) << gen;
  }
}

TEST(SaveFile, ATemporaryFileWhoseWriterHoldsItsLockIsKeptWhateverItsPid) {
  // A writer in another PID namespace: its PID means nothing here (4194305 is above pid_max,
  // so no process of this namespace has it), but it holds the lock on its file.
  TempDir dir;
  const fs::path theirs = dir / ".m.safetensors.ferry-4194305-abcdef";
  test::write_file(theirs, "a save in progress");
  const int held = ::open(theirs.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  const fs::path gone = dir / ".n.safetensors.ferry-4194305-fedcba";
  test::write_file(gone, "a killed save");
  EXPECT_EQ(remove_stale_temps(dir.path()), 1u);
  EXPECT_TRUE(fs::exists(theirs));
  EXPECT_FALSE(fs::exists(gone));
  ::close(held);
  EXPECT_EQ(remove_stale_temps(dir.path()), 1u);
  EXPECT_FALSE(fs::exists(theirs));
}

TEST(SaveCheckpoint, ADurableSaveSyncsTheParentOfEveryFolderItMakes) {
  TempDir root;
  const fs::path dir = root / "a" / "b";
  const fs::path count_file = root / "counts";
  const auto r =
      probe_with_shim({"checkpoint", dir.string(), "1", "2"}, "pwrite:0:kill", count_file.string());
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::ifstream in(count_file);
  std::stringstream text;
  text << in.rdbuf();
  const fs::path real = fs::canonical(root.path());
  for (const fs::path& parent : {real, real / "a", real / "a" / "b"}) {
    EXPECT_NE(text.str().find("fsync_dir " + parent.string() + "\n"), std::string::npos)
        << parent << " in " << text.str();
  }
}

bool can_run_as_nobody() {
  return geteuid() == 0 && std::system("command -v setpriv >/dev/null") == 0;
}

// Finding 13 of issue 45: a read-only target blamed the temporary file. A save replaces only a
// file its writer could open for writing, and says so naming the file.
TEST(SaveFile, AReadOnlyTargetIsRefusedNamingItAndLeftAsItWas) {
  if (!can_run_as_nobody()) GTEST_SKIP() << "needs root and setpriv (to save as nobody)";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);
  const fs::path target = dir / "m.safetensors";
  test::write_file(target, "old bytes");
  ASSERT_EQ(::chown(target.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chmod(target.c_str(), 0444), 0);
  const auto r =
      test::run_process({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                         FERRY_SAVE_PROBE, "file", target.string(), "2"},
                        {}, 60);
  EXPECT_EQ(r.exit_code, 4) << r.describe();
  EXPECT_NE(r.output.find(target.string() + ": " + std::strerror(EACCES)), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("could open for writing"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(".ferry-"), std::string::npos) << r.output;
  std::ifstream in(target);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "old bytes");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"m.safetensors"});
}

// Finding 8 of issue 45: root saving over another user's setuid file made a root-owned setuid
// file. The new file takes the old owner where the writer may give it, and a set-id bit only
// with the owner it had.
TEST(SaveFile, ASetuidFileOfAnotherOwnerNeverBecomesASetuidFileOfTheWriter) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (to own another user's file)";
  TempDir dir;
  const fs::path target = dir / "m.safetensors";
  test::write_file(target, "old bytes");
  ASSERT_EQ(::chown(target.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chmod(target.c_str(), 06755), 0);
  const auto r = probe({"file", target.string(), "2"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_gid, 65534u);
  EXPECT_EQ(st.st_mode & 07777, 06755u);
  EXPECT_EQ(generation_of(target), 2);
}

}  // namespace
}  // namespace ferry
