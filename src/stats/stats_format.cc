// ProcessStats as JSON, as text in the route report's words, and as OpenMetrics text.
#include <fmt/format.h>

#include <cmath>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>

#include "ferry/sizes.h"
#include "ferry/stats.h"

namespace ferry {
namespace {

nlohmann::json route_json(const RouteCounters& c) {
  return {
      {"requests", c.requests()}, {"reads", c.reads},           {"writes", c.writes},
      {"failed", c.failed},       {"bytes_read", c.bytes_read}, {"bytes_written", c.bytes_written},
      {"tasks", c.tasks}};
}

nlohmann::json latency_json(const LatencyHistogram& h, double sum) {
  nlohmann::json buckets = nlohmann::json::array();
  for (std::size_t b = 0; b < LatencyHistogram::kBuckets; ++b) {
    if (h.counts[b] == 0) continue;
    const double le = LatencyHistogram::bound(b);
    buckets.push_back({{"le", std::isinf(le) ? nlohmann::json("+Inf") : nlohmann::json(le)},
                       {"count", h.counts[b]}});
  }
  auto q = [&h](double p) {
    const double v = h.quantile(p);
    return std::isinf(v) ? nlohmann::json("+Inf") : nlohmann::json(v);
  };
  return {{"count", h.total()}, {"seconds", sum},   {"p50_le", q(0.5)},
          {"p99_le", q(0.99)},  {"max_le", q(1.0)}, {"buckets", buckets}};
}

nlohmann::json path_json(const PathCounters& p) {
  nlohmann::json j = route_json(p.counts);
  j["seconds"] = p.seconds();
  j["reasons"] = p.reasons;
  j["latency"] = {{"read", latency_json(p.read_latency, p.read_seconds)},
                  {"write", latency_json(p.write_latency, p.write_seconds)}};
  return j;
}

std::string utc(double unix_seconds) {
  if (unix_seconds <= 0) return "unknown";
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string duration_words(double s) {
  if (s >= 1) return fmt::format("{:.3g} s", s);
  if (s >= 1e-3) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} us", s * 1e6);
}

std::string latency_words(const LatencyHistogram& h) {
  if (h.total() == 0) return "";
  auto le = [&h](double q) {
    const double v = h.quantile(q);
    return std::isinf(v) ? std::string("more than 1e3 s") : "<= " + duration_words(v);
  };
  return fmt::format("p50 {}, p99 {}", le(0.5), le(0.99));
}

std::string route_words(const RouteCounters& c) {
  return fmt::format(
      "{} request(s) ({} read(s), {} write(s), {} failed), {} task(s), {} read, "
      "{} written",
      c.requests(), c.reads, c.writes, c.failed, c.tasks, format_size(c.bytes_read, true),
      format_size(c.bytes_written, true));
}

// OpenMetrics label values: backslash, double quote and newline escaped.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

}  // namespace

double LatencyHistogram::bound(std::size_t bucket) {
  if (bucket + 1 >= kBuckets) return std::numeric_limits<double>::infinity();
  return 1024e-9 * std::ldexp(1.0, static_cast<int>(bucket));
}

std::uint64_t LatencyHistogram::total() const {
  std::uint64_t n = 0;
  for (std::uint64_t c : counts) n += c;
  return n;
}

double LatencyHistogram::quantile(double q) const {
  const std::uint64_t n = total();
  if (n == 0) return 0;
  const double want = std::ceil(q * static_cast<double>(n));
  std::uint64_t seen = 0;
  for (std::size_t b = 0; b < kBuckets; ++b) {
    seen += counts[b];
    if (static_cast<double>(seen) >= want && seen > 0) return bound(b);
  }
  return bound(kBuckets - 1);
}

std::string ProcessStats::to_json() const {
  nlohmann::json memories_json = nlohmann::json::array();
  for (const MemoryCounters& m : memories) {
    memories_json.push_back({{"device", m.device},
                             {"memory", m.name},
                             {"posix", route_json(m.posix)},
                             {"cufile", route_json(m.cufile)},
                             {"layer2",
                              {{"nvfs", m.nvfs_pieces},
                               {"posix", m.compat_pieces},
                               {"p2p", m.p2p_pieces},
                               {"shared_windows", m.shared_windows}}}});
  }
  nlohmann::json j = {
      {"pid", pid},
      {"uid", uid},
      {"command", command},
      {"path", path},
      {"layout_version", layout_version},
      {"ferry_version", ferry_version},
      {"process_started", process_started},
      {"counting_since", counting_since},
      {"read_at", read_at},
      {"exited", exited},
      {"totals", nlohmann::json::parse(totals.to_json())},
      {"layer1",
       {{"posix_tasks", totals.posix_tasks},
        {"cufile_tasks", totals.cufile_tasks},
        {"direct_tasks", direct_tasks},
        {"posix", path_json(posix)},
        {"cufile", path_json(cufile)}}},
      {"layer2",
       {{"nvfs", totals.nvfs_pieces},
        {"posix", totals.compat_pieces},
        {"p2p", totals.p2p_pieces},
        {"shared_windows", totals.shared_windows}}},
      {"memories", memories_json},
      {"inflight",
       {{"known", inflight_known},
        {"requests", inflight_known ? nlohmann::json(inflight_requests) : nlohmann::json(nullptr)},
        {"bytes", inflight_known ? nlohmann::json(inflight_bytes) : nlohmann::json(nullptr)}}},
  };
  nlohmann::json others = nlohmann::json::array();
  for (const OtherSegment& o : other_segments) {
    others.push_back({{"path", o.path}, {"state", o.state}, {"detail", o.detail}});
  }
  j["other_segments"] = others;
  return j.dump();
}

std::string ProcessStats::to_text() const {
  std::string t =
      fmt::format("process {} ({}), uid {}, ferry {}{}\n", pid, command.empty() ? "?" : command,
                  uid, ferry_version, exited ? ": exited, these are its last counters" : "");
  t += fmt::format("  started {}; counting since {}\n", utc(process_started), utc(counting_since));
  t += fmt::format("  requests: {} ({} failed), {} read, {} written, {} of request time\n",
                   totals.requests, totals.failed_requests, format_size(totals.bytes_read, true),
                   format_size(totals.bytes_written, true), duration_words(totals.seconds));
  const std::uint64_t tasks = totals.posix_tasks + totals.cufile_tasks;
  t += fmt::format("  layer 1 (ferry): {} task(s): {} to cuFile, {} to the POSIX path\n", tasks,
                   totals.cufile_tasks, totals.posix_tasks);
  const PathCounters* paths[] = {&posix, &cufile};
  const char* names[] = {"posix", "cufile"};
  for (int i = 0; i < 2; ++i) {
    const PathCounters& p = *paths[i];
    if (p.counts.requests() == 0 && p.counts.tasks == 0) {
      t += fmt::format("    {}: no request\n", names[i]);
      continue;
    }
    t += fmt::format("    {}: {}\n", names[i], route_words(p.counts));
    const std::string rl = latency_words(p.read_latency), wl = latency_words(p.write_latency);
    if (!rl.empty()) t += fmt::format("      read latency {}\n", rl);
    if (!wl.empty()) t += fmt::format("      write latency {}\n", wl);
    for (const auto& [code, n] : p.reasons) t += fmt::format("      {}: {}\n", code, n);
  }
  if (direct_tasks != 0) {
    t += fmt::format("    cold POSIX tasks read with O_DIRECT: {}\n", direct_tasks);
  }
  t += fmt::format("  layer 2 (cuFile): nvfs={} posix={} p2p={}{}\n", totals.nvfs_pieces,
                   totals.compat_pieces, totals.p2p_pieces,
                   totals.shared_windows != 0
                       ? fmt::format(" ({} request(s) counted over windows shared with others)",
                                     totals.shared_windows)
                       : "");
  for (const MemoryCounters& m : memories) {
    t += fmt::format("  memory {}:", m.name);
    if (m.posix.requests() != 0) t += " posix " + route_words(m.posix) + ";";
    if (m.cufile.requests() != 0) t += " cufile " + route_words(m.cufile) + ";";
    if (m.nvfs_pieces + m.compat_pieces + m.p2p_pieces != 0) {
      t += fmt::format(" layer 2 nvfs={} posix={} p2p={}", m.nvfs_pieces, m.compat_pieces,
                       m.p2p_pieces);
    }
    if (t.back() == ';') t.pop_back();
    t += "\n";
  }
  if (inflight_known) {
    t += fmt::format("  in flight: {} request(s), {}\n", inflight_requests,
                     format_size(inflight_bytes, true));
  } else {
    t += "  in flight: not counted (this process's ferry does not report request starts)\n";
  }
  for (const OtherSegment& o : other_segments) {
    t += fmt::format("  also named for pid {}, not read as its counters: {}: {}\n", pid, o.state,
                     o.detail);
  }
  return t;
}

std::string to_openmetrics(const std::vector<ProcessStats>& processes) {
  std::string out;
  auto base = [](const ProcessStats& p) {
    return fmt::format("pid=\"{}\",command=\"{}\"", p.pid, label(p.command));
  };
  auto family = [&out](const char* name, const char* type, const char* unit, const char* help) {
    out += fmt::format("# TYPE {} {}\n", name, type);
    if (unit != nullptr) out += fmt::format("# UNIT {} {}\n", name, unit);
    out += fmt::format("# HELP {} {}\n", name, help);
  };
  const char* path_names[] = {"posix", "cufile"};
  auto each_route = [&](const ProcessStats& p, auto&& body) {
    for (const MemoryCounters& m : p.memories) {
      body(m, "posix", m.posix);
      body(m, "cufile", m.cufile);
    }
  };

  family("ferry_process", "info", nullptr, "A process that publishes ferry counters.");
  for (const ProcessStats& p : processes) {
    out += fmt::format("ferry_process_info{{{},uid=\"{}\",ferry_version=\"{}\"}} 1\n", base(p),
                       p.uid, label(p.ferry_version));
  }
  family("ferry_process_start_time_seconds", "gauge", "seconds",
         "When the process started (unix time).");
  for (const ProcessStats& p : processes) {
    out += fmt::format("ferry_process_start_time_seconds{{{}}} {}\n", base(p),
                       number(p.process_started));
  }
  // A counter of each memory's posix and cufile routes: `lines(head, c)` adds a route's lines,
  // `head` being the sample's name and labels up to the memory's, without the closing brace.
  auto route_counter = [&](const char* name, const char* unit, const char* help, auto&& lines) {
    family(name, "counter", unit, help);
    for (const ProcessStats& p : processes) {
      each_route(p, [&](const MemoryCounters& m, const char* path, const RouteCounters& c) {
        lines(fmt::format("{}_total{{{},path=\"{}\",memory=\"{}\"", name, base(p), path,
                          label(m.name)),
              c);
      });
    }
  };
  auto by_op = [&out](const std::string& head, std::uint64_t reads, std::uint64_t writes) {
    out += fmt::format("{},op=\"read\"}} {}\n{},op=\"write\"}} {}\n", head, reads, head, writes);
  };
  route_counter("ferry_requests", nullptr,
                "Requests ferry served, by path (layer 1), memory and operation.",
                [&](const std::string& head, const RouteCounters& c) {
                  if (c.requests() != 0) by_op(head, c.reads, c.writes);
                });
  route_counter("ferry_failed_requests", nullptr, "Requests that failed, by path and memory.",
                [&](const std::string& head, const RouteCounters& c) {
                  if (c.requests() != 0) out += fmt::format("{}}} {}\n", head, c.failed);
                });
  route_counter("ferry_bytes", "bytes", "Bytes moved, by path, memory and operation.",
                [&](const std::string& head, const RouteCounters& c) {
                  if (c.requests() != 0) by_op(head, c.bytes_read, c.bytes_written);
                });
  route_counter("ferry_tasks", nullptr, "Tasks (pieces of requests), by path and memory.",
                [&](const std::string& head, const RouteCounters& c) {
                  if (c.tasks != 0) out += fmt::format("{}}} {}\n", head, c.tasks);
                });
  family("ferry_route_reasons", "counter", nullptr,
         "Requests that gave each reason for their path (route report reason codes).");
  for (const ProcessStats& p : processes) {
    const PathCounters* paths[] = {&p.posix, &p.cufile};
    for (int i = 0; i < 2; ++i) {
      for (const auto& [code, n] : paths[i]->reasons) {
        out += fmt::format("ferry_route_reasons_total{{{},path=\"{}\",reason=\"{}\"}} {}\n",
                           base(p), path_names[i], label(code), n);
      }
    }
  }
  family("ferry_cufile_pieces", "counter", nullptr,
         "Layer 2: cuFile's pieces by how it served them (nvfs, posix, p2p) and memory.");
  for (const ProcessStats& p : processes) {
    for (const MemoryCounters& m : p.memories) {
      const std::pair<const char*, std::uint64_t> kinds[] = {
          {"nvfs", m.nvfs_pieces}, {"posix", m.compat_pieces}, {"p2p", m.p2p_pieces}};
      if (m.cufile.requests() == 0 && m.nvfs_pieces + m.compat_pieces + m.p2p_pieces == 0) {
        continue;
      }
      for (const auto& [kind, n] : kinds) {
        out += fmt::format("ferry_cufile_pieces_total{{{},memory=\"{}\",layer2=\"{}\"}} {}\n",
                           base(p), label(m.name), kind, n);
      }
    }
  }
  family("ferry_request_duration_seconds", "histogram", "seconds",
         "Request durations, by path and operation.");
  for (const ProcessStats& p : processes) {
    const PathCounters* paths[] = {&p.posix, &p.cufile};
    for (int i = 0; i < 2; ++i) {
      for (int op = 0; op < 2; ++op) {
        const LatencyHistogram& h = op == 0 ? paths[i]->read_latency : paths[i]->write_latency;
        if (h.total() == 0) continue;
        const std::string labels = fmt::format("{},path=\"{}\",op=\"{}\"", base(p), path_names[i],
                                               op == 0 ? "read" : "write");
        std::uint64_t cumulative = 0;
        for (std::size_t b = 0; b < LatencyHistogram::kBuckets; ++b) {
          cumulative += h.counts[b];
          // Every bucket up to the highest used, then +Inf: enough for quantiles, less text.
          const bool last = b + 1 == LatencyHistogram::kBuckets;
          if (!last && cumulative == 0) continue;
          out += fmt::format("ferry_request_duration_seconds_bucket{{{},le=\"{}\"}} {}\n", labels,
                             number(LatencyHistogram::bound(b)), cumulative);
          if (!last && cumulative == h.total()) {
            out += fmt::format("ferry_request_duration_seconds_bucket{{{},le=\"+Inf\"}} {}\n",
                               labels, cumulative);
            break;
          }
        }
        out += fmt::format("ferry_request_duration_seconds_count{{{}}} {}\n", labels, h.total());
        out += fmt::format("ferry_request_duration_seconds_sum{{{}}} {}\n", labels,
                           number(op == 0 ? paths[i]->read_seconds : paths[i]->write_seconds));
      }
    }
  }
  family("ferry_inflight_bytes", "gauge", "bytes", "Bytes of requests begun and not yet ended.");
  for (const ProcessStats& p : processes) {
    if (p.inflight_known) {
      out += fmt::format("ferry_inflight_bytes{{{}}} {}\n", base(p), p.inflight_bytes);
    }
  }
  out += "# EOF\n";
  return out;
}

}  // namespace ferry
