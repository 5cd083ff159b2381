#include "checkpoint/gathered_read.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "cuda/cuda_driver.h"
#include "ferry/memory.h"
#include "io/io_seam.h"

namespace ferry::checkpoint {

SpanPlan plan_spans(std::span<const ReadRange> ranges, std::size_t task_size,
                    std::uint64_t max_gap) {
  std::vector<std::size_t> order;
  order.reserve(ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].size > 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ranges[a].file_offset < ranges[b].file_offset;
  });
  SpanPlan plan;
  // The span being built: ranges [first, k) of `order`, file bytes [begin, end).
  std::size_t first = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  auto close = [&](std::size_t k) {
    if (k == first) return;
    if (k - first == 1) {
      plan.direct.push_back(ranges[order[first]]);
    } else {
      const std::size_t at = plan.staged_bytes;
      plan.spans.push_back({begin, static_cast<std::size_t>(end - begin),
                            reinterpret_cast<void*>(static_cast<std::uintptr_t>(at))});
      for (std::size_t j = first; j < k; ++j) {
        const ReadRange& r = ranges[order[j]];
        plan.pieces.push_back(
            {at + static_cast<std::size_t>(r.file_offset - begin), r.buffer, r.size});
      }
      plan.staged_bytes += end - begin;
    }
    first = k;
  };
  for (std::size_t k = 0; k < order.size(); ++k) {
    const ReadRange& r = ranges[order[k]];
    const std::uint64_t r_end = r.file_offset + r.size;
    if (r.size >= task_size) {
      close(k);
      plan.direct.push_back(r);
      first = k + 1;
      continue;
    }
    const bool joins =
        k > first && r.file_offset <= end + max_gap && std::max(end, r_end) - begin <= task_size;
    if (!joins) {
      close(k);
      begin = r.file_offset;
      end = r_end;
    } else {
      end = std::max(end, r_end);
    }
  }
  close(order.size());
  return plan;
}

GatheredRead::GatheredRead(File& file, std::span<const ReadRange> ranges) {
  for (const ReadRange& r : ranges) wanted_ += r.size;
  if (!io::is_remote_url(file.path())) {
    futures_.push_back(file.pread_gather(ranges));
    return;
  }
  plan_ = plan_spans(ranges, file.effective_settings().task_size);
  if (plan_.spans.empty()) {
    futures_.push_back(file.pread_gather(plan_.direct));
    return;
  }
  // Fresh memory faults in a page at a time as the GETs land, which cost more than the copy out
  // (perf on this machine's VM: page faults were most of a 3000-tensor load's CPU): in 2 MiB
  // pages, where the kernel gives them.
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  const std::size_t bytes = (plan_.staged_bytes + kHugePage - 1) / kHugePage * kHugePage;
  staging_.reset(static_cast<char*>(std::aligned_alloc(kHugePage, bytes)));
  if (!staging_) throw std::bad_alloc();
  advise_huge_pages(staging_.get(), bytes);
  for (ReadRange& s : plan_.spans) {
    s.buffer = staging_.get() + reinterpret_cast<std::uintptr_t>(s.buffer);
  }
  // One request moves bytes into one kind of memory: where the tensors are pageable host memory,
  // as the staging is, spans and direct ranges are one request. Otherwise (pinned or GPU memory)
  // the spans are read first and the tensors of task_size or more after them, one request at a
  // time, so that each route counts its own GETs (two at once on one object would each count
  // both).
  const bool pageable = plan_.direct.empty() || classify_memory(plan_.direct.front().buffer).kind ==
                                                    MemoryKind::kHostPageable;
  if (pageable) {
    std::vector<ReadRange> all = plan_.spans;
    all.insert(all.end(), plan_.direct.begin(), plan_.direct.end());
    plan_.spans = std::move(all);  // kept until the read ends
    futures_.push_back(file.pread_gather(plan_.spans));
    return;
  }
  futures_.push_back(file.pread_gather(plan_.spans));
  futures_.back().wait();
  futures_.push_back(file.pread_gather(plan_.direct));
}

void GatheredRead::wait(ProgressMeter& meter, const std::function<std::uint64_t()>& done) const {
  for (const IoFuture& f : futures_) meter.wait(f, done);
}

void GatheredRead::wait() const {
  for (const IoFuture& f : futures_) {
    if (f.valid()) f.wait();
  }
}

std::uint64_t GatheredRead::progress() const {
  std::uint64_t moved = 0;
  for (const IoFuture& f : futures_) moved += f.progress();
  return std::min(moved, wanted_);  // the gaps of spans are read too
}

std::size_t GatheredRead::get() {
  wait();
  for (const IoFuture& f : futures_) f.get();  // the first error, once every read has ended
  if (!plan_.pieces.empty()) {
    const MemoryInfo memory = classify_memory(plan_.pieces.front().to);
    if (memory.kind == MemoryKind::kDevice) {
      const cuda::Driver& driver = cuda::driver();
      cuda::use_device(memory.device);
      for (const SpanPlan::Piece& p : plan_.pieces) {
        cuda::check(driver.MemcpyHtoD(reinterpret_cast<cuda::abi::DevicePtr>(p.to),
                                      staging_.get() + p.from, p.size),
                    "cuMemcpyHtoD (a checkpoint's coalesced tensors into GPU memory)");
      }
    } else {
      for (const SpanPlan::Piece& p : plan_.pieces) {
        std::memcpy(p.to, staging_.get() + p.from, p.size);
      }
    }
  }
  return wanted_;
}

std::vector<RouteReport> GatheredRead::routes() const {
  std::vector<RouteReport> out;
  for (const IoFuture& f : futures_) out.push_back(f.route());
  return out;
}

}  // namespace ferry::checkpoint
