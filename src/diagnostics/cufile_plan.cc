#include "diagnostics/cufile_plan.h"

#include <fmt/format.h>

#include <algorithm>

namespace ferry {
namespace {

constexpr std::uint64_t kPieceAlignment = 4096;

}  // namespace

// Evidence (docs/platform.md, device.md): on cuFile 1.15 with the stock cufile.json, level-3
// stats counted, per request, 1 piece for 4 and 8 MiB, 2 for 16 MiB, 4 for 32 MiB, and 4 for
// 64 MiB, 256 MiB and 1 GiB, registered and unregistered buffers alike; the article saw a 1 GiB
// request cut into 4 x 256 MiB. So count = min(max_request_parallelism, max(1, size / threshold))
// with equal pieces. What was not measured: sizes that are not a multiple of the threshold below
// the cap (the rounding is assumed to be floor), where exactly unequal pieces break, and what
// happens with parallel_io=false.
CufilePieces predict_cufile_pieces(std::uint64_t size, bool registered,
                                   const CufileScheduling& cufile) {
  (void)registered;  // measured identical for registered and unregistered buffers
  CufilePieces p;
  if (!cufile.parallel_io || !cufile.min_io_threshold_size_kb || !cufile.max_request_parallelism) {
    p.words = "cuFile's splitting is not known: " +
              (cufile.unknown_reason.empty() ? std::string("a cufile.json value is unknown")
                                             : cufile.unknown_reason);
    return p;
  }
  if (!*cufile.parallel_io) {
    p.words = "cuFile's splitting rule with parallel_io=false is not known";
    return p;
  }
  std::uint64_t threshold = *cufile.min_io_threshold_size_kb * 1024;
  std::uint64_t parallelism = *cufile.max_request_parallelism;
  if (threshold == 0 || parallelism == 0) {
    p.words = fmt::format(
        "cuFile's splitting with min_io_threshold_size_kb={} and max_request_parallelism={} is "
        "not known",
        *cufile.min_io_threshold_size_kb, parallelism);
    return p;
  }
  p.known = true;
  if (size == 0) {
    p.count_measured = true;
    p.words = "an empty request is not cut";
    return p;
  }
  p.count = std::min(parallelism, std::max<std::uint64_t>(1, size / threshold));
  p.count_measured = size <= threshold || size % threshold == 0 || size >= parallelism * threshold;
  if (size % p.count == 0) {
    p.first_size = p.last_size = size / p.count;
  } else {
    std::uint64_t even = (size + p.count - 1) / p.count;
    p.first_size = (even + kPieceAlignment - 1) / kPieceAlignment * kPieceAlignment;
    if (p.first_size * (p.count - 1) >= size) p.first_size = even;
    p.last_size = size - p.first_size * (p.count - 1);
  }
  if (p.count == 1) {
    p.words = size < 2 * threshold
                  ? fmt::format(
                        "1 piece of {} (cuFile splits only from 2 x {}, "
                        "min_io_threshold_size_kb)",
                        format_size(size), format_size(threshold))
                  : fmt::format("1 piece of {} (max_request_parallelism is 1)", format_size(size));
  } else if (p.first_size == p.last_size) {
    p.words = fmt::format("{} pieces of {}", p.count, format_size(p.first_size));
  } else {
    p.words = fmt::format("{} pieces: {} x {} then {} (piece boundaries are a prediction)", p.count,
                          p.count - 1, format_size(p.first_size), format_size(p.last_size));
  }
  if (!p.count_measured)
    p.words += fmt::format(
        "; {} is not a multiple of {}: the count assumes cuFile rounds down, "
        "which was not measured",
        format_size(size), format_size(threshold));
  return p;
}

}  // namespace ferry

namespace ferry::diagnostics {

CufileScheduling scheduling_from_config(const platform::CufileConfig& c) {
  CufileScheduling s;
  s.parallel_io = c.parallel_io.value;
  s.min_io_threshold_size_kb = c.min_io_threshold_size_kb.value;
  s.max_request_parallelism = c.max_request_parallelism.value;
  s.source = fmt::format("{} ({})", c.path.string(), to_string(c.state));
  for (const auto* v : {&c.min_io_threshold_size_kb, &c.max_request_parallelism}) {
    if (!v->value && s.unknown_reason.empty()) s.unknown_reason = v->problem;
  }
  if (!c.parallel_io.value && s.unknown_reason.empty()) s.unknown_reason = c.parallel_io.problem;
  return s;
}

}  // namespace ferry::diagnostics

namespace ferry {

CufileScheduling read_cufile_scheduling(const std::filesystem::path& root) {
  return diagnostics::scheduling_from_config(
      platform::read_cufile_config(root, platform::process_environment()));
}

}  // namespace ferry
