#include "checkpoint/temp_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "ferry/atomic_file.h"
#include "ferry/error.h"

namespace ferry::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMarker = ".ferry-";
constexpr std::size_t kRandom = 10;  // letters and digits after the marker
// An index larger than this is not one of ferry's or transformers' (shard_index.h's limit).
constexpr std::uintmax_t kMaxIndexBytes = 64u << 20;

bool alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

std::string random_suffix() {
  static constexpr char kChars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  unsigned char bytes[kRandom];
  if (getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
    // getrandom cannot fail for 10 bytes once the pool is ready; O_EXCL still keeps names apart.
    for (std::size_t i = 0; i < kRandom; ++i) bytes[i] = static_cast<unsigned char>(rand());
  }
  std::string s;
  for (unsigned char b : bytes) s += kChars[b % (sizeof kChars - 1)];
  return s;
}

// .NAME.ferry-XXXXXXXXXX, NAME cut (at a UTF-8 character's start) so that the whole stays within
// NAME_MAX: a 255-byte NAME is a valid file name, and its temporary name must be one too.
std::string temp_name(const fs::path& dest) {
  std::string base = dest.filename().string();
  const std::size_t room = NAME_MAX - 1 - kMarker.size() - kRandom;
  if (base.size() > room) {
    std::size_t cut = room;
    while (cut > 0 && (static_cast<unsigned char>(base[cut]) & 0xC0) == 0x80) --cut;
    base.resize(cut);
  }
  return "." + base + std::string(kMarker) + random_suffix();
}

[[noreturn]] void fail(int err, const fs::path& dest, const char* what) {
  throw IoError(err, "open", dest.string(), 0, 0, 0,
                fmt::format("{} ({} the temporary file beside {}, in {})", std::strerror(err), what,
                            dest.filename().string(), folder_of(dest).string()));
}

void lock_or_fail(int fd, const fs::path& dest) {
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    fail(err, dest, "locking");
  }
}

// The names every index file in `dirfd` names (their weight_map's shard files).
std::set<std::string> indexed_names(DIR* d) {
  std::set<std::string> names;
  rewinddir(d);
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    constexpr std::string_view kIndex = ".safetensors.index.json";
    if (name.size() < kIndex.size() ||
        name.compare(name.size() - kIndex.size(), kIndex.size(), kIndex) != 0) {
      continue;
    }
    const int fd = ::openat(dirfd(d), name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st {};
    std::string text;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        static_cast<std::uintmax_t>(st.st_size) <= kMaxIndexBytes) {
      text.resize(static_cast<std::size_t>(st.st_size));
      const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
      text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    }
    ::close(fd);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) continue;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (file.is_string()) names.insert(fs::path(file.get<std::string>()).filename().string());
    }
  }
  return names;
}

}  // namespace

TempFile::TempFile(const fs::path& dest) {
  const fs::path folder = folder_of(dest);
  // O_TMPFILE: a file with no name yet, locked, then given its name (linkat through /proc,
  // which needs no privilege). File systems without it (NFS, some FUSE) and machines without
  // /proc fall back to an O_EXCL create, which leaves a moment between the name and the lock.
  const int anon = ::open(folder.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0666);
  if (anon >= 0) {
    lock_or_fail(anon, dest);
    const std::string proc = fmt::format("/proc/self/fd/{}", anon);
    for (int attempt = 0; attempt < 100; ++attempt) {
      const fs::path name = folder / temp_name(dest);
      if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) {
        path_ = name;
        fd_ = anon;
        return;
      }
      if (errno != EEXIST) break;
    }
    const int err = errno;
    ::close(anon);
    if (err != ENOENT) fail(err, dest, "naming");  // ENOENT: no /proc; fall back
  } else if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
    fail(errno, dest, "creating");
  }
  for (int attempt = 0; attempt < 100; ++attempt) {
    const fs::path name = folder / temp_name(dest);
    const int fd = ::open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0666);
    if (fd >= 0) {
      lock_or_fail(fd, dest);
      path_ = name;
      fd_ = fd;
      return;
    }
    if (errno != EEXIST) fail(errno, dest, "creating");
  }
  fail(EEXIST, dest, "creating");
}

TempFile::~TempFile() { close(); }

void TempFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

fs::path folder_of(const fs::path& p) {
  return p.parent_path().empty() ? fs::path(".") : p.parent_path();
}

bool is_temp_name(std::string_view name) {
  const std::size_t at = name.rfind(kMarker);
  if (name.size() < 2 || name[0] != '.' || at == std::string_view::npos || at < 2) return false;
  const std::string_view tail = name.substr(at + kMarker.size());
  auto all = [](std::string_view s, auto pred) {
    for (char c : s) {
      if (!pred(c)) return false;
    }
    return !s.empty();
  };
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (tail.size() == kRandom && all(tail, alnum)) return true;
  // Earlier versions: PID-XXXXXX (mkostemp) and PID-L00000 (a second link of a shard).
  const std::size_t dash = tail.find('-');
  if (dash == std::string_view::npos || !all(tail.substr(0, dash), digit)) return false;
  const std::string_view rest = tail.substr(dash + 1);
  return (rest.size() == 6 && all(rest, alnum)) ||
         (rest.size() == 6 && rest[0] == 'L' && all(rest.substr(1), digit));
}

}  // namespace ferry::checkpoint

namespace ferry {

// A save interrupted between its two indexes leaves the new checkpoint under temporary names:
// the index names them, so they stay. Never follows a link.
std::size_t remove_stale_temps(const std::filesystem::path& folder) {
  using checkpoint::is_temp_name;
  DIR* d = opendir(folder.c_str());
  if (d == nullptr) return 0;
  const std::set<std::string> keep = checkpoint::indexed_names(d);
  std::size_t removed = 0;
  rewinddir(d);
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (!is_temp_name(name) || keep.count(name) > 0) continue;
    const int fd = ::openat(dirfd(d), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat held {
    }, now{};
    // Taking the lock proves its writer gone; the name must still be the file locked (a writer
    // that renamed it away and another that made a new one of the same name are both possible).
    if (::fstat(fd, &held) == 0 && S_ISREG(held.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        ::fstatat(dirfd(d), name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 &&
        now.st_ino == held.st_ino && now.st_dev == held.st_dev &&
        ::unlinkat(dirfd(d), name.c_str(), 0) == 0) {
      ++removed;
    }
    ::close(fd);
  }
  closedir(d);
  return removed;
}

}  // namespace ferry
