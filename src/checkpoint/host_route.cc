#include "checkpoint/host_route.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/io_seam.h"
#include "io/page_cache.h"

namespace ferry {

FileMapping::FileMapping(int fd, std::uint64_t offset, std::uint64_t size, std::string file)
    : offset_(offset), size_(size), file_(std::move(file)) {
  // Private and writable: a write copies the page (copy-on-write) and never reaches the file,
  // and frameworks can wrap the memory without a read-only copy (torch.frombuffer warns on one).
  void* p =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) throw IoError(errno, "mmap (MAP_PRIVATE)", file_, offset, size);
  data_ = p;
}

FileMapping::~FileMapping() { ::munmap(data_, size_); }

}  // namespace ferry

namespace ferry::checkpoint {

HostRoute decide_host_route(HostLoad mode, bool remote, bool direct,
                            const PageCacheResidency& residency) {
  HostRoute r;
  r.page_cache = residency;
  auto read = [&](std::string why) {
    r.path = "read";
    r.reason = std::move(why);
    return r;
  };
  if (mode == HostLoad::kRead) return read("host_load=read");
  if (remote) {
    return read(mode == HostLoad::kMap
                    ? "host_load=map, but a remote object cannot be mapped: ranged GETs"
                    : "a remote object: ranged GETs");
  }
  r.path = "mapped";
  if (mode == HostLoad::kMap) {
    r.reason = "host_load=map: tensors are views of a private mapping";
    return r;
  }
  if (direct) return read("direct=true asks for O_DIRECT reads (host_load=map maps anyway)");
  if (!residency.known) return read("residency unknown (" + residency.why_not + ")");
  if (residency.fraction() < kMapResident) {
    return read(fmt::format("not resident in the page cache ({}; mapped from {:.0f}%)",
                            describe(residency), kMapResident * 100));
  }
  r.reason = fmt::format("resident in the page cache ({}): tensors are views of a private mapping",
                         describe(residency));
  return r;
}

MappedShard route_shard(HostLoad mode, bool direct, const std::string& name,
                        const std::filesystem::path& path, std::uint64_t size, std::uint64_t begin,
                        std::uint64_t end) {
  const bool remote = io::is_remote_url(path.string());
  if (mode == HostLoad::kRead || remote) {
    MappedShard out{decide_host_route(mode, remote, direct, {}), nullptr};
    out.route.file = name;
    return out;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(errno, "open (to map)", name, begin, end - begin);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError(errno, "fstat (to map)", name, begin, end - begin);
  if (static_cast<std::uint64_t>(st.st_size) != size) {
    throw CheckpointError(
        name, "",
        fmt::format("it is {} B now but was {} B when its header was read", st.st_size, size));
  }
  MappedShard out{
      decide_host_route(mode, false, direct, io::measure_residency(fd, begin, end - begin)),
      nullptr};
  out.route.file = name;
  if (out.route.path != "mapped") return out;
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t first = begin / page * page;
  try {
    out.mapping = std::make_shared<const FileMapping>(fd, first, end - first, name);
  } catch (const IoError& e) {
    // A file system without mmap, or an address space too small (RLIMIT_AS): the read needs
    // neither.
    out.route.path = "read";
    out.route.reason = fmt::format("{}, but the mapping failed ({}): read instead",
                                   out.route.reason.substr(0, out.route.reason.find(':')),
                                   std::strerror(e.error_code()));
  }
  return out;
}

bool viewable_in_place(const TensorInfo& t) {
  const unsigned bytes = dtype_bits(t.dtype) / 8;
  return bytes <= 1 || t.file_offset % bytes == 0;
}

}  // namespace ferry::checkpoint
