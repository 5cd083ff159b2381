#include "cufile/cufile_backend.h"

#include <fmt/format.h>

#include <cerrno>

#include "cuda/cuda_driver.h"
#include "cufile/cufile_buffers.h"
#include "cufile/cufile_driver.h"
#include "ferry/error.h"

namespace ferry::cufile {
namespace {

class CufileWorker final : public core::Worker {
 public:
  CufileWorker(const core::RequestContext& c, const FileState& file) : c_(c), file_(file) {
    // cuFile works in the calling thread's CUDA context. A host buffer here comes only from
    // the test hook that stands the test double in for cuFile: there is no context to set.
    if (is_gpu(c.memory.kind)) cuda::use_device(c.memory.device);
    // A registered buffer must be named by the base it was registered with.
    auto reg = find_registered(c.buffer);
    base_ = reg ? static_cast<char*>(reg->base) : c.buffer;
  }

  std::size_t run(const core::Task& task) override {
    const Library& lib = file_.library();
    const bool read = c_.op == Op::kRead;
    char* base = base_;
    if (c_.gathered) {
      // The ranges of a gathered read may lie in different allocations: name each by its own
      // registered base, or by its own address.
      char* dst = c_.buffer + task.buffer_offset;
      auto reg = find_registered(dst);
      base = reg ? static_cast<char*>(reg->base) : dst;
    }
    const off_t start = static_cast<off_t>(c_.buffer + task.buffer_offset - base);
    std::size_t done = 0;
    while (done < task.size) {
      if (c_.cancelled.load(std::memory_order_relaxed)) break;
      std::size_t len = task.size - done;
      off_t file_offset = static_cast<off_t>(task.file_offset + done);
      off_t buffer_offset = start + static_cast<off_t>(done);
      calls_in_flight().fetch_add(1, std::memory_order_relaxed);
      ssize_t n = read ? lib.Read(file_.handle(), base, len, file_offset, buffer_offset)
                       : lib.Write(file_.handle(), base, len, file_offset, buffer_offset);
      int saved = errno;
      calls_in_flight().fetch_sub(1, std::memory_order_relaxed);
      if (n < 0) {
        int err = n == -1 ? saved : (-n < 5000 ? static_cast<int>(-n) : EIO);
        throw IoError(err, read ? "cuFileRead" : "cuFileWrite", c_.file.path(),
                      static_cast<std::uint64_t>(file_offset), len, done,
                      describe_io_result(static_cast<long>(n), saved));
      }
      if (n == 0) {
        if (read) break;  // end of file
        throw IoError(EIO, "cuFileWrite", c_.file.path(), static_cast<std::uint64_t>(file_offset),
                      len, done, "cuFileWrite wrote 0 bytes");
      }
      done += static_cast<std::size_t>(n);
    }
    return done;
  }

 private:
  const core::RequestContext& c_;
  const FileState& file_;
  char* base_ = nullptr;
};

}  // namespace

std::unique_ptr<core::Worker> CufileBackend::make_worker(const core::RequestContext& context) {
  return std::make_unique<CufileWorker>(context, *file_);
}

std::string CufileBackend::describe(const core::RequestContext& context) const {
  bool registered = find_registered(context.buffer).has_value();
  return fmt::format("{} of {} tasks from {} thread(s), {} buffer",
                     context.op == Op::kRead ? "cuFileRead" : "cuFileWrite",
                     format_size(context.settings.task_size), context.workers,
                     registered ? "registered" : "unregistered");
}

}  // namespace ferry::cufile
