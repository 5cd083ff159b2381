// ferry::explain: layer 1 through the request engine's own rule and cuFile probe, so that the
// prediction and the read cannot disagree on it; layer 2 from the platform facts, each blocking
// fact in words. Nothing here reads file data. A diagnostics front end above core: it may use the
// backends' own headers, which core does not.
#include "ferry/explain.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "backends/default_runtime.h"
#include "core/open_file.h"
#include "core/report_json.h"
#include "core/request_plan.h"
#include "core/runtime_state.h"
#include "core/task_splitter.h"
#include "cufile/cufile_file.h"
#include "cufile/cufile_outlook.h"
#include "ferry/plan.h"
#include "io/io_seam.h"
#include "posix/posix_backend.h"

namespace ferry {

Layer2Facts layer2_facts(const PlatformReport& p, const PlatformStorage* storage) {
  cufile::Layer2Judgement j = cufile::judge_layer2(p, storage);
  Layer2Facts f;
  for (cufile::Blocker& b : j.blocking) f.blocking.push_back(std::move(b.words));
  f.unknowns = std::move(j.unknowns);
  f.fs_support = std::move(j.fs_support);
  return f;
}

namespace {

// Layer 2: what cuFile will do with the requests layer 1 sends it.
void predict_layer2(const ExplainRequest& r, Explanation& e) {
  const PlatformReport& p = e.platform;
  e.layer2 = !e.blocking.empty()   ? PredictedLayer2::kCompat
             : !e.unknowns.empty() ? PredictedLayer2::kUnknown
                                   : PredictedLayer2::kNvfs;
  if (e.layer2 == PredictedLayer2::kCompat &&
      cufile_setting(p, "properties.allow_compat_mode") == "false" && !e.failure)
    e.failure =
        "properties.allow_compat_mode is false, so cuFile would fail these reads rather than "
        "serve them through its compatibility path";
  if (e.layer2 != PredictedLayer2::kNvfs && e.settings.require == Require::kGds && !e.failure)
    e.failure = fmt::format(
        "require=gds would fail the read after it: cuFile is predicted not to use nvidia-fs ({})",
        e.blocking.empty() ? "undecided: " + e.unknowns.front() : e.blocking.front());

  // Pieces: each task is one cuFile request, cut by cuFile's thread pool.
  CufileScheduling sched = read_cufile_scheduling(r.root);
  const core::TaskShape shape = core::task_shape(e.size, e.settings.task_size);
  const std::uint64_t task = shape.task_size, full = shape.full, rest = shape.rest;
  std::uint64_t total = 0;
  bool known = true;
  for (auto [count, size] : {std::pair<std::uint64_t, std::uint64_t>{full, task},
                             std::pair<std::uint64_t, std::uint64_t>{rest ? 1 : 0, rest}}) {
    if (count == 0) continue;
    CufilePieces pieces = predict_cufile_pieces(size, false, sched);
    known = known && pieces.known;
    total += count * pieces.count;
    e.pieces_words.push_back(
        fmt::format("{} request(s) of {}: {}", count, format_size(size), pieces.words));
  }
  if (known) e.pieces = total;
}

// The PCI distance between the target GPU and the file's device, as a note.
void note_distance(const CudaStatus& cuda, Explanation& e) {
  if (!is_gpu(e.memory) || e.device < 0 || static_cast<std::size_t>(e.device) >= cuda.gpus.size())
    return;
  std::string bus = normalize_pci_bus_id(cuda.gpus[e.device].pci_bus_id);
  for (const auto& d : e.storage.gpu_distances) {
    if (normalize_pci_bus_id(d.gpu_bus_id) != bus) continue;
    e.notes.push_back(fmt::format("PCI distance GPU {} ({}) to the file's device: {} ({})",
                                  e.device, bus, d.distance.value_or("unknown"), d.reason));
    return;
  }
  e.notes.push_back(fmt::format("PCI distance GPU {} to the file's device: unknown ({})", e.device,
                                e.storage.pci_reason));
}

}  // namespace

std::string to_string(PredictedLayer2 p) {
  switch (p) {
    case PredictedLayer2::kNone:
      return "none";
    case PredictedLayer2::kNvfs:
      return "nvfs";
    case PredictedLayer2::kCompat:
      return "compat";
    case PredictedLayer2::kUnknown:
      return "unknown";
  }
  return "?";
}

Explanation explain(const std::filesystem::path& path, const ExplainRequest& r) {
  Explanation e;
  e.file = path.string();
  FileOptions options{r.direct, r.settings, r.runtime};
  auto file = std::make_shared<core::OpenFile>(path, "r", options, backends::runtime_of(options));
  e.file = file->path();  // a URL without its query
  e.remote = file->remote();
  e.settings = file->settings();
  e.file_size = file->size();
  e.offset = r.offset;
  const std::uint64_t wanted = r.size.value_or(e.file_size > r.offset ? e.file_size - r.offset : 0);
  e.size = r.offset >= e.file_size ? 0 : std::min<std::uint64_t>(wanted, e.file_size - r.offset);

  // The memory `ferry read` would use.
  CudaStatus cuda = cuda_status();
  ChosenMemory chosen = core::choose_memory({r.gpu, r.host, r.pinned}, cuda);
  const MemoryInfo& memory = chosen.memory;
  e.memory = memory.kind;
  e.device = memory.device;
  e.memory_note = chosen.note;
  e.failure = chosen.failure;

  e.platform = read_platform(r.root);
  for (auto& g : e.platform.gpus) {
    for (const auto& c : cuda.gpus) {
      if (normalize_pci_bus_id(c.pci_bus_id) == normalize_pci_bus_id(g.bus_id)) g.name = c.name;
    }
  }
  if (e.remote) {
    // What the open learnt of the server's ranges (a HEAD's Accept-Ranges, or a GET of bytes
    // 0-0) is what a read goes by: the same words, the same choice as make_job's.
    const std::optional<io::RangeSupport> ranges = file->io().range_support(file->fd());
    const std::string basis = ranges ? ranges->basis : "unknown";
    const std::uint64_t last = e.size == 0 ? e.offset : e.offset + e.size - 1;
    const std::string skipped =
        e.offset > 0
            ? fmt::format("the {} B before offset {} received and discarded, ", e.offset, e.offset)
            : std::string();
    if (ranges && ranges->kind == io::RangeSupport::Kind::kIgnored) {
      e.source = fmt::format(
          "one GET of the whole object, streamed in order on one worker (the server ignores "
          "Range: {}); {}the transfer cut after byte {}",
          basis, skipped, last);
    } else if (ranges && ranges->kind == io::RangeSupport::Kind::kUnknown) {
      e.source = fmt::format(
          "one GET from byte {}, streamed in order on one worker: the server has not said "
          "whether it serves ranges ({}), and that GET's answer tells; should it be the whole "
          "object, {}the transfer cut after byte {}",
          e.offset, basis, skipped, last);
    } else {
      e.source = fmt::format(
          "ranged GETs of up to {} (task_size), {} at once (the server serves ranges: {})",
          format_size(e.settings.task_size),
          std::min<std::size_t>(
              workers_for(e.settings, is_gpu(memory.kind), /*remote=*/true),
              std::max<std::uint64_t>(
                  1, core::TaskSplitter(e.offset, e.size, e.settings.task_size).count())),
          basis);
    }
    e.direct_error = "a remote object";
  } else {
    e.storage = read_storage(path, e.platform.gpus, r.root);
    // The same O_DIRECT open cuFile's probe makes, reported even when cuFile is not reached.
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    e.direct_ok = fd >= 0;
    if (fd >= 0) {
      ::close(fd);
    } else {
      e.direct_error = std::strerror(errno);
    }
  }

  // Layer 1: the plan core::submit makes for this read, from the same facts.
  core::RequestPlan route = core::plan_route(e.settings, file->runtime().env().layer1_view(memory),
                                             e.size, {file.get(), Op::kRead, e.offset, e.size, {}});
  e.page_cache = route.residency;
  e.cufile = cufile_status(false);
  e.path = route.path;
  e.reasons = route.reasons;
  if (route.refusal && !e.failure) e.failure = route.refusal;
  if (file->direct_requested() && file->direct_fd() < 0)
    e.reasons.push_back({ReasonCode::kDirectIoRefused, file->direct_refused()});
  core::TaskSplitter split(e.offset, e.size, e.settings.task_size);
  e.tasks = split.count();
  (e.path == Path::kCufile ? e.cufile_tasks : e.posix_tasks) = e.tasks;
  if (e.path == Path::kPosix && !r.direct && e.direct_ok && !e.failure) {
    for (std::size_t i = 0; i < split.count(); ++i)
      e.direct_tasks += posix::reads_cold(*file->runtime().env().host, e.page_cache, file->fd(),
                                          split[i].file_offset, split[i].size);
    if (e.direct_tasks > 0)
      e.reasons.push_back({ReasonCode::kColdDirect,
                           fmt::format("{} of {} task(s) are not in the page cache and will read "
                                       "with O_DIRECT",
                                       e.direct_tasks, e.tasks)});
  }

  // Host memory asked for never goes to cuFile: what blocks nvidia-fs cannot matter to this read.
  // Where host memory is only the fallback (no GPU here), the facts still describe the storage.
  const bool gpu_memory = !e.remote && (is_gpu(e.memory) || (!r.host && !r.pinned));
  if (gpu_memory) {
    // The facts that keep cuFile off nvidia-fs, gathered whichever path layer 1 takes: a read
    // that does not reach cuFile today may reach it once the layer-1 blocker is gone.
    Layer2Facts facts = layer2_facts(e.platform, &e.storage);
    e.blocking = std::move(facts.blocking);
    e.unknowns = std::move(facts.unknowns);
    e.fs_support = std::move(facts.fs_support);
  }
  if (e.path == Path::kCufile) predict_layer2(r, e);
  // Measured on the GPU machine (docs/platform.md): without it cuFileHandleRegister fails with
  // 5027, so layer 1 falls back; said even where an earlier blocker hides it.
  if (gpu_memory && e.storage.udev_fs_usage == false) {
    std::string text =
        fmt::format("udev, device {}: {}", e.storage.device.value_or("?"), e.storage.udev_reason);
    if (text.find("5027") == std::string::npos)
      text += " (cuFileHandleRegister fails with 5027 without ID_FS_USAGE)";
    e.blocking.push_back(text);
  }
  note_distance(cuda, e);
  return e;
}

std::string Explanation::verdict() const {
  if (failure) return "the read would fail: " + *failure;
  std::string l1;
  if (path == Path::kPosix) {
    std::string why;
    for (const RouteReason& r : reasons) why += (why.empty() ? "" : "; ") + r.text;
    l1 = fmt::format("ferry's POSIX path will read {} task(s), cuFile is not called: {}", tasks,
                     why);
  } else {
    l1 = fmt::format("{} request(s) will go to cuFile", cufile_tasks);
    std::string count = pieces ? fmt::format("{} piece(s)", *pieces) : "its pieces";
    switch (layer2) {
      case PredictedLayer2::kNvfs:
        l1 += fmt::format(", which should serve {} through nvidia-fs (no blocking fact found)",
                          count);
        break;
      case PredictedLayer2::kCompat:
        l1 += fmt::format(", which will serve {} through its POSIX compatibility path: {}", count,
                          blocking.front());
        break;
      default:
        l1 += fmt::format("; whether cuFile uses nvidia-fs is unknown: {}", unknowns.front());
    }
  }
  return l1;
}

std::string Explanation::to_text() const {
  std::string o = fmt::format("explain: {}\n", verdict());
  auto line = [&](std::string_view label, const std::string& value) {
    o += fmt::format("  {:<10} {}\n", label, value);
  };
  line("file", fmt::format("{} ({} B), read {} B at offset {}", file, file_size, size, offset));
  line("memory", to_string(memory) + (is_gpu(memory) ? fmt::format(" {}", device) : "") +
                     (memory_note.empty() ? "" : "; " + memory_note));
  line("settings",
       fmt::format("compat_mode={} require={} task_size={} gds_threshold={}",
                   to_string(settings.compat_mode), to_string(settings.require),
                   format_size(settings.task_size), format_size(settings.gds_threshold)));
  const PlatformStorage& s = storage;
  if (remote) line("source", source);
  if (!remote)
    line("mount",
         s.mount_point
             ? fmt::format("{} {} from {} ({}), options {} super {}", *s.mount_point,
                           s.fs_type.value_or("?"), s.source.value_or("?"), s.device.value_or("?"),
                           s.mount_options.value_or("?"), s.super_options.value_or("?"))
             : "unknown: " + s.mount_reason);
  if (!remote) line("fs", fs_support);
  if (!remote) line("O_DIRECT", direct_ok ? "opens" : "refused: " + direct_error);
  if (!remote)
    line("udev",
         fmt::format("ID_FS_USAGE {}: {}",
                     s.udev_fs_usage ? (*s.udev_fs_usage ? "present" : "missing") : "unknown",
                     s.udev_reason));
  line("nvidia-fs", platform.nvfs.loaded ? "loaded" : "not loaded: " + platform.nvfs.reason);
  line("iommu", platform.iommu.how);
  line("cuFile", cufile.loaded ? fmt::format("{} {}{}", cufile.library, cufile.version_text,
                                             cufile.driver_open ? ", driver open" : "")
                               : "not loaded: " + cufile.load_error);
  line("cache", describe(page_cache));
  o += fmt::format("  layer 1 (ferry): {}: {} task(s): {} to cuFile, {} to the POSIX path\n",
                   to_string(path), tasks, cufile_tasks, posix_tasks);
  for (const RouteReason& r : reasons) o += fmt::format("    {}: {}\n", to_string(r.code), r.text);
  o += fmt::format("  layer 2 (cuFile): {}\n", to_string(layer2));
  for (const auto& w : pieces_words) o += fmt::format("    pieces: {}\n", w);
  for (const auto& b : blocking) o += fmt::format("    blocks nvidia-fs: {}\n", b);
  for (const auto& u : unknowns) o += fmt::format("    unknown: {}\n", u);
  for (const auto& n : notes) o += fmt::format("    note: {}\n", n);
  if (failure) o += fmt::format("  fails: {}\n", *failure);
  return o;
}

std::string Explanation::to_json() const {
  using nlohmann::json;
  json reasons_json = json::array();
  for (const RouteReason& r : reasons)
    reasons_json.push_back({{"code", to_string(r.code)}, {"text", r.text}});
  auto count = [&](PredictedLayer2 which) -> json {
    if (layer2 == PredictedLayer2::kNone) return 0;
    if (!pieces || layer2 == PredictedLayer2::kUnknown) return nullptr;
    return layer2 == which ? *pieces : 0;
  };
  json j = {
      {"file", file},
      {"remote", remote},
      {"source", source},
      {"file_size", file_size},
      {"offset", offset},
      {"size", size},
      {"memory", to_string(memory)},
      {"device", device},
      {"memory_note", memory_note},
      {"settings",
       {{"compat_mode", to_string(settings.compat_mode)},
        {"require", to_string(settings.require)},
        {"task_size", settings.task_size},
        {"gds_threshold", settings.gds_threshold}}},
      {"o_direct", {{"ok", direct_ok}, {"error", direct_error}}},
      {"fs_support", fs_support},
      {"platform", json::parse(platform_report_json(platform, storage))},
      {"cufile", json::parse(cufile.to_json())},
      {"layer1",
       {{"path", to_string(path)},
        {"tasks", tasks},
        {"posix_tasks", posix_tasks},
        {"cufile_tasks", cufile_tasks},
        {"direct_tasks", direct_tasks},
        {"reasons", reasons_json}}},
      {"page_cache", core::page_cache_json(page_cache)},
      {"layer2",
       {{"path", to_string(layer2)},
        {"pieces", pieces ? json(*pieces) : json(nullptr)},
        {"pieces_words", pieces_words},
        {"expected",
         {{"nvfs", count(PredictedLayer2::kNvfs)}, {"posix", count(PredictedLayer2::kCompat)}}},
        {"blocking", blocking},
        {"unknowns", unknowns},
        {"notes", notes}}},
      {"failure", failure ? json(*failure) : json(nullptr)},
      {"verdict", verdict()},
  };
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

}  // namespace ferry
