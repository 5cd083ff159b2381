#include "ferry/route.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/report_json.h"
#include "ferry/settings.h"

namespace ferry {

std::string describe(const PageCacheResidency& p) {
  if (!p.known) return "unknown: " + p.why_not;
  return fmt::format("{} of {} resident ({:.0f}%{}, {})", format_size(p.resident),
                     format_size(p.bytes), p.fraction() * 100, p.estimated ? ", sampled" : "",
                     p.method);
}

std::string RouteReport::verdict() const {
  std::string why;
  for (const RouteReason& r : reasons) {
    if (r.code != ReasonCode::kEngine) why += why.empty() ? r.text : "; " + r.text;
  }
  std::string text;
  if (cufile_tasks == 0) {
    text = fmt::format("{} task(s) went to ferry's POSIX path, cuFile was not called", tasks);
    if (!why.empty()) text += fmt::format(": {}", why);
    return text;
  }
  text = fmt::format("{} request(s) went to cuFile", cufile_tasks);
  if (posix_tasks > 0) text += fmt::format(" and {} to ferry's POSIX path", posix_tasks);
  if (!cufile.observable) {
    return text + fmt::format("; what cuFile did is not observable: {}", cufile.why_not);
  }
  std::uint64_t pieces = cufile.nvfs + cufile.posix + cufile.p2p;
  std::string window = cufile.shared_window ? " (counted over a window shared with other "
                                              "requests)"
                                            : "";
  if (cufile.posix == 0 && cufile.p2p == 0) {
    text += fmt::format("; cuFile served all {} piece(s) through nvidia-fs{}", pieces, window);
  } else if (cufile.nvfs == 0 && cufile.p2p == 0) {
    text += fmt::format("; cuFile served all {} piece(s) through its POSIX compatibility path{}",
                        pieces, window);
    if (!cufile.compat_why.empty()) text += fmt::format(": {}", cufile.compat_why);
  } else {
    text += fmt::format(
        "; cuFile served {} piece(s) through nvidia-fs, {} through its POSIX "
        "compatibility path and {} through PCI P2PDMA{}",
        cufile.nvfs, cufile.posix, cufile.p2p, window);
  }
  return text;
}

std::string RouteReport::to_text() const {
  // The reasons are listed once, under layer 1: a POSIX headline does not repeat them.
  std::string text =
      cufile_tasks == 0
          ? fmt::format("route: {} task(s) went to ferry's POSIX path, cuFile was not called\n",
                        tasks)
          : fmt::format("route: {}\n", verdict());
  if (ranges > 0) {
    text += fmt::format("  gathered: {} range(s) in {} run(s) once adjacent ones were coalesced\n",
                        ranges, runs);
  }
  text += fmt::format("  layer 1 (ferry): {} task(s): {} to cuFile, {} to the POSIX path\n", tasks,
                      cufile_tasks, posix_tasks);
  for (const RouteReason& r : reasons) {
    text += fmt::format("    {}: {}\n", to_string(r.code), r.text);
  }
  text += fmt::format("    page cache before the request: {}\n", describe(page_cache));
  if (source.remote) {
    text += fmt::format(
        "  source ({}): {} {}GET(s), {} B, {} new connection(s), {} retr{}{}{}\n", source.url,
        source.gets, source.range_ignored ? "" : "ranged ", source.bytes, source.connections,
        source.retries, source.retries == 1 ? "y" : "ies",
        source.retried.empty() ? "" : ": " + source.retried,
        source.shared_window ? " (window shared with other requests on the object)" : "");
    if (source.range_ignored) {
      text += fmt::format(
          "    the server ignores Range: streamed in order from {} GET(s) of the whole object, "
          "{} B before the bytes asked for received and discarded\n",
          source.gets, source.discarded);
    }
    text += fmt::format("    authentication: {}\n", source.auth);
  }
  if (cufile.observable) {
    text +=
        fmt::format("  layer 2 (cuFile): nvfs={} posix={} p2p={}{}\n", cufile.nvfs, cufile.posix,
                    cufile.p2p, cufile.shared_window ? " (window shared with other requests)" : "");
    if (!cufile.counted_over.empty()) {
      text += fmt::format("    counted on: {}\n", cufile.counted_over);
    }
    if (!cufile.compat_why.empty()) {
      text += fmt::format("    compatibility path: {}\n", cufile.compat_why);
    }
    if (!cufile.unjudged.empty()) text += fmt::format("    strict mode: {}\n", cufile.unjudged);
  } else {
    text += fmt::format("  layer 2 (cuFile): not observable: {}\n", cufile.why_not);
  }
  if (cufile_tasks > 0) {
    if (cufile.module_observable) {
      text += fmt::format("  nvidia-fs (system-wide): {} {} counted\n", cufile.module_ops,
                          op == Op::kRead ? "reads" : "writes");
    } else {
      text += fmt::format("  nvidia-fs (system-wide): not observable: {}\n", cufile.module_why_not);
    }
  }
  return text;
}

std::string RouteReport::to_json() const {
  nlohmann::json reasons_json = nlohmann::json::array();
  for (const RouteReason& r : reasons) {
    reasons_json.push_back({{"code", to_string(r.code)}, {"text", r.text}});
  }
  nlohmann::json j = {
      {"op", to_string(op)},
      {"file", file},
      {"memory", to_string(memory)},
      {"device", device},
      {"offset", offset},
      {"requested", requested},
      {"bytes", bytes},
      {"tasks", tasks},
      {"ranges", ranges},
      {"runs", runs},
      {"seconds", seconds},
      {"direct", direct},
      {"workers", workers},
      {"page_cache", core::page_cache_json(page_cache)},
      {"layer1",
       {{"posix_tasks", posix_tasks},
        {"cufile_tasks", cufile_tasks},
        {"direct_tasks", direct_tasks},
        {"reasons", reasons_json}}},
      {"layer2",
       {{"observable", cufile.observable},
        {"why_not", cufile.why_not},
        {"shared_window", cufile.shared_window},
        {"gpu_entry", cufile.gpu_entry},
        {"counted_over", cufile.counted_over},
        {"unjudged", cufile.unjudged},
        {"nvfs", cufile.nvfs},
        {"posix", cufile.posix},
        {"p2p", cufile.p2p},
        {"version", cufile.version},
        {"compat_why", cufile.compat_why},
        {"nvfs_module",
         {{"observable", cufile.module_observable},
          {"why_not", cufile.module_why_not},
          {"ops", cufile.module_ops}}}}},
      {"verdict", verdict()},
  };
  if (source.remote) {
    j["source"] = {{"url", source.url},
                   {"auth", source.auth},
                   {"gets", source.gets},
                   {"retries", source.retries},
                   {"connections", source.connections},
                   {"bytes", source.bytes},
                   {"retried", source.retried},
                   {"shared_window", source.shared_window},
                   {"range_ignored", source.range_ignored},
                   {"discarded", source.discarded}};
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ferry
