// ferry::cufile_status(): the loader, driver and statistics state in one value, for `ferry check`.
#include <nlohmann/json.hpp>

#include "cufile/cufile_driver.h"
#include "cufile/cufile_stats.h"
#include "ferry/cufile.h"
#include "ferry/settings.h"

namespace ferry {

CufileStatus cufile_status(bool open_driver) {
  CufileStatus s;
  const cufile::LoadResult& l = cufile::load();
  s.library = l.path;
  s.loaded = l.library != nullptr;
  s.load_error = l.why_not;
  s.missing_symbols = l.missing_required;
  if (l.library != nullptr) {
    for (const std::string& m : l.library->missing_optional) s.missing_symbols.push_back(m);
  }
  std::string version_why;
  s.version = cufile::version(&version_why);
  s.version_text = cufile::version_text(s.version);
  s.stats_layout_known = cufile::stats_layout(s.version) != cufile::StatsLayout::kUnknown;
  // A status is read to diagnose (ferry check): a malformed FERRY_* variable leaves its default
  // here rather than failing the report (on the H200, `FERRY_TASK_SIZE=lots ferry check` exited
  // before its report wherever libcufile loads).
  if (s.loaded && open_driver)
    cufile::open_driver(check_settings().settings.require == Require::kGds);
  cufile::DriverState d = cufile::driver_state();
  s.driver_open_attempted = d.attempted;
  s.driver_open = d.open;
  s.compat_mode_refused = d.compat_refused;
  s.driver_error = d.error;
  s.driver_error_text = d.error_text;
  s.stats_why_not = s.loaded ? cufile::stats_unavailable() : l.why_not;
  return s;
}

std::string CufileStatus::to_json() const {
  nlohmann::json j = {{"library", library},
                      {"loaded", loaded},
                      {"load_error", load_error},
                      {"missing_symbols", missing_symbols},
                      {"version", version},
                      {"version_text", version_text},
                      {"stats_layout_known", stats_layout_known},
                      {"driver_open_attempted", driver_open_attempted},
                      {"driver_open", driver_open},
                      {"compat_mode_refused", compat_mode_refused},
                      {"driver_error", driver_error},
                      {"driver_error_text", driver_error_text},
                      {"stats_why_not", stats_why_not}};
  return j.dump();
}

}  // namespace ferry
