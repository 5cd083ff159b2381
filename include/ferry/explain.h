// ferry::explain: the route one read would take, predicted at both layers before any byte moves.
// Layer 1 is decided by the same rule, facts and cuFile probe as a real read (the file is
// opened, its page-cache residency measured, O_DIRECT tested and, where the rule reaches it,
// cuFile's handle registered; nothing is read).
// Layer 2 is predicted from the platform facts (nvidia-fs, file system, device, IOMMU,
// cufile.json) and says what blocks the accelerated path. Thread-safe; the result is a value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ferry/cufile.h"
#include "ferry/memory.h"
#include "ferry/platform.h"
#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry {

class Runtime;

// The read to predict: the same choices `ferry read` takes.
struct ExplainRequest {
  std::optional<int> gpu;  // GPU ordinal; by default GPU 0 when one exists, else host memory
  bool host = false;       // pageable host memory
  bool pinned = false;     // pinned host memory
  std::optional<std::uint64_t> size;  // by default to the end of the file
  std::uint64_t offset = 0;
  bool direct = false;               // FileOptions::direct
  SettingsOverride settings;         // on top of the process-wide settings
  std::filesystem::path root = "/";  // where /proc, /sys, /run/udev and /etc are read
  // The runtime the read would run on (FileOptions::runtime), whose environment decides layer 1;
  // null: the process's default.
  Runtime* runtime = nullptr;
};

// Layer 2 as predicted: what cuFile will do with the requests it receives.
enum class PredictedLayer2 {
  kNone,     // cuFile is not called
  kNvfs,     // no known fact blocks nvidia-fs
  kCompat,   // a fact forces cuFile's POSIX compatibility path
  kUnknown,  // a fact that decides it could not be read
};
std::string to_string(PredictedLayer2 p);

struct Explanation {
  std::string file;
  // A remote object (http, https, s3): the storage facts below are not read; `source` says how
  // its bytes come.
  bool remote = false;
  std::string source;
  std::uint64_t file_size = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;  // the bytes the read would move (clipped at end of file)
  MemoryKind memory = MemoryKind::kHostPageable;
  int device = -1;
  std::string memory_note;  // why host memory when it was not asked for
  Settings settings;        // the effective settings of the read
  bool direct_ok = false;   // an O_DIRECT open of the file succeeded
  std::string direct_error;
  PlatformReport platform;
  PlatformStorage storage;
  CufileStatus cufile;
  std::string fs_support;  // what cuFile makes of this file system, in words

  // Layer 1: comparable field by field with RouteReport's (engine reasons excepted).
  Path path = Path::kPosix;
  std::size_t tasks = 0;
  std::size_t posix_tasks = 0;
  std::size_t cufile_tasks = 0;
  std::vector<RouteReason> reasons;
  std::optional<std::string> failure;  // the read would fail, and why
  PageCacheResidency page_cache;       // residency of the range now
  std::size_t direct_tasks = 0;        // POSIX tasks that will read with O_DIRECT (cold pages)

  // Layer 2.
  PredictedLayer2 layer2 = PredictedLayer2::kNone;
  std::vector<std::string> blocking;      // facts that keep cuFile off nvidia-fs
  std::vector<std::string> unknowns;      // facts that could not be read
  std::vector<std::string> notes;         // facts that do not block but matter (distance)
  std::optional<std::uint64_t> pieces;    // cuFile pieces in all, when known
  std::vector<std::string> pieces_words;  // per task size: "2 pieces of 8 MiB"

  // One sentence naming both layers' paths.
  std::string verdict() const;
  std::string to_text() const;
  // A stable JSON object (documented in docs/cli.md).
  std::string to_json() const;
};

// What keeps cuFile off nvidia-fs, in words, judged once for explain and `ferry check`: the
// machine's facts (cufile.json, nvidia-fs, the IOMMU) and, given a file's `storage`, its file
// system and device; without one, whether nvidia-fs can serve local NVMe at all.
struct Layer2Facts {
  std::vector<std::string> blocking;  // facts that keep cuFile off nvidia-fs
  std::vector<std::string> unknowns;  // facts that could not be read
  std::string fs_support;             // what cuFile makes of the file system (storage only)
};
Layer2Facts layer2_facts(const PlatformReport& platform, const PlatformStorage* storage);

// Throws IoError when `file` cannot be opened or stat()ed; every other fact is reported.
Explanation explain(const std::filesystem::path& file, const ExplainRequest& request = {});

}  // namespace ferry
