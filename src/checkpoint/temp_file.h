// The temporary files of ferry's atomic saves (save_file, save_checkpoint, ferry write): an empty
// file beside its destination, named .NAME.ferry-XXXXXXXXXX, that holds an exclusive flock for
// as long as its writer lives. The lock, not a process ID, proves a leftover stale: a PID names
// another process in another PID namespace or on another host sharing the file system, a lock
// is released by the kernel when its holder dies, wherever it ran. Not thread-safe: one owner.
#pragma once

#include <filesystem>
#include <string_view>

namespace ferry::checkpoint {

class TempFile {
 public:
  // Creates the file beside `dest` (NAME cut to fit NAME_MAX), mode 0666 less the umask (the
  // kernel applies it: no umask(2), whose read-and-restore races with other threads), locked
  // before it has a name where the file system allows O_TMPFILE (so no cleanup can ever see it
  // unlocked), else locked right after an O_EXCL create. Throws IoError naming `dest`.
  explicit TempFile(const std::filesystem::path& dest);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  int fd() const { return fd_; }  // open read-write; holds the lock
  // Closes the descriptor, which releases the lock; the file stays.
  void close();

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// The folder `p` is in: its parent, or "." for a bare name.
std::filesystem::path folder_of(const std::filesystem::path& p);

// Whether `name` is a temporary name of ferry's saves, this version's or an earlier one's
// (.NAME.ferry-PID-XXXXXX, .NAME.ferry-PID-L00000).
bool is_temp_name(std::string_view name);

// An IoError from writing `temp` (the temporary file of `dest`) restated to name `dest`.
[[noreturn]] void rethrow_naming(const std::filesystem::path& dest,
                                 const std::filesystem::path& temp);

}  // namespace ferry::checkpoint
