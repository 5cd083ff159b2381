// The names of the route vocabulary (include/ferry/route.h): what every room below core records
// and prints (the stats, the reports) without linking core.
#include <string>

#include "ferry/route.h"

namespace ferry {

std::string to_string(ReasonCode code) {
  switch (code) {
    case ReasonCode::kCompatModeOn:
      return "compat_mode_on";
    case ReasonCode::kHostBuffer:
      return "host_buffer";
    case ReasonCode::kBelowThreshold:
      return "below_threshold";
    case ReasonCode::kCufileUnavailable:
      return "cufile_unavailable";
    case ReasonCode::kCufileCompatOnly:
      return "cufile_compat_only";
    case ReasonCode::kPageCacheResident:
      return "page_cache_resident";
    case ReasonCode::kColdDirect:
      return "cold_direct";
    case ReasonCode::kNoCudaDriver:
      return "no_cuda_driver";
    case ReasonCode::kDirectIoRefused:
      return "direct_io_refused";
    case ReasonCode::kEngine:
      return "engine";
    case ReasonCode::kRemoteSource:
      return "remote_source";
  }
  return "?";
}

std::string to_string(Op op) { return op == Op::kRead ? "read" : "write"; }
std::string to_string(Path path) { return path == Path::kPosix ? "posix" : "cufile"; }

}  // namespace ferry
