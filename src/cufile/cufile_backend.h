// The cuFile path: each task is one cuFileRead or cuFileWrite of the caller's GPU buffer (base
// address plus offset, the registered base where the buffer was registered). One backend per
// request, holding the file's cuFile handle for the request's lifetime. Thread-safe; each
// Worker belongs to one thread.
#pragma once

#include <memory>

#include "core/backend.h"
#include "cufile/cufile_file.h"

namespace ferry::cufile {

class CufileBackend final : public core::Backend {
 public:
  explicit CufileBackend(std::shared_ptr<FileState> file) : file_(std::move(file)) {}
  std::unique_ptr<core::Worker> make_worker(const core::RequestContext& context) override;
  std::string describe(const core::RequestContext& context) const override;

 private:
  std::shared_ptr<FileState> file_;
};

}  // namespace ferry::cufile
