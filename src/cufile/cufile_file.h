// One File as cuFile sees it: a third descriptor, opened with O_DIRECT as cuFile requires, and
// its registered handle. Made on the first request that routes to cuFile and kept by the
// OpenFile until close(); requests in flight hold their own reference. Immutable once made.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "core/open_file.h"
#include "cufile/cufile_library.h"
#include "ferry/settings.h"

namespace ferry::cufile {

class FileState {
 public:
  FileState(const Library& library, int fd, abi::Handle handle);
  ~FileState();  // deregisters the handle, closes the descriptor
  FileState(const FileState&) = delete;
  FileState& operator=(const FileState&) = delete;

  const Library& library() const { return library_; }
  abi::Handle handle() const { return handle_; }

 private:
  const Library& library_;
  int fd_;
  abi::Handle handle_;
};

// Layer 1's question, "can cuFile serve this file?": the library loads, the driver opens (with
// compatibility refused under require=gds), the O_DIRECT open and cuFileHandleRegister succeed.
// Per-file outcomes are cached on the OpenFile; driver outcomes process-wide.
struct Probe {
  std::shared_ptr<FileState> state;  // null when cuFile cannot serve the file
  std::string why_not;
  bool compat_refused = false;  // the driver was opened with compatibility refused
};
// `root`: the tree of the machine's facts (cufile/cufile_machine.h).
Probe probe(core::OpenFile& file, const Settings& settings,
            const std::filesystem::path& root = "/");

}  // namespace ferry::cufile
