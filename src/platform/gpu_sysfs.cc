#include "platform/gpu_sysfs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "platform/text_file.h"

namespace ferry::platform {
namespace {

constexpr std::uint32_t kNvidiaVendor = 0x10de;

std::optional<std::uint64_t> read_hex(const std::filesystem::path& p) {
  auto f = read_text_file(p);
  return f.ok ? parse_u64(f.text) : std::nullopt;
}

bool looks_like_version(std::string_view t) {
  if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0]))) return false;
  return t.find('.') != std::string_view::npos && std::all_of(t.begin(), t.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || c == '.';
         });
}

}  // namespace

std::vector<PciResource> parse_pci_resource(std::string_view text) {
  std::vector<PciResource> out;
  for (auto line : split_lines(text)) {
    auto f = split_whitespace(line);
    if (f.size() < 3) continue;
    auto s = parse_u64(f[0]), e = parse_u64(f[1]), fl = parse_u64(f[2]);
    out.push_back(PciResource{s.value_or(0), e.value_or(0), fl.value_or(0)});
  }
  return out;
}

// The resource file has one line per resource index: lines 0-5 are the BAR registers, line 6 the
// expansion ROM. A 64-bit BAR takes two registers, so the line after it is empty. NVIDIA's names
// count memory BARs in order: BAR0 registers, BAR1 framebuffer aperture, BAR3 a small 64-bit
// window. On GPUs with a 32-bit BAR0, BAR1 is line 1; the H200 on the GPU machine (2026-11-30)
// has a 64-bit BAR0 and shows lines 0 (16 MiB), 2 (256 GiB) and 4 (32 MiB). So BAR1 is the second
// non-empty memory resource among lines 0-5, not a fixed line.
std::optional<std::uint64_t> nvidia_bar1_size(const std::vector<PciResource>& resources) {
  int seen = 0;
  for (std::size_t i = 0; i < resources.size() && i < 6; ++i) {
    if (!resources[i].is_memory() || resources[i].size() == 0) continue;
    if (++seen == 2) return resources[i].size();
  }
  return std::nullopt;
}

GpuList read_gpus(const std::filesystem::path& root) {
  GpuList out;
  auto dir = under_root(root, "/sys/bus/pci/devices");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    out.reason = fmt::format("{} does not exist: GPUs unknown", "/sys/bus/pci/devices");
    return out;
  }
  out.known = true;
  std::vector<std::filesystem::path> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) entries.push_back(e.path());
  std::sort(entries.begin(), entries.end());
  for (const auto& p : entries) {
    auto vendor = read_hex(p / "vendor");
    auto cls = read_hex(p / "class");
    if (!vendor || *vendor != kNvidiaVendor || !cls || ((*cls >> 16) & 0xff) != 0x03) continue;
    GpuSysfs g;
    g.bus_id = p.filename();
    g.device_id = static_cast<std::uint32_t>(read_hex(p / "device").value_or(0));
    if (auto numa = read_text_file(p / "numa_node"); numa.ok)
      if (auto v = parse_i64(numa.text)) g.numa_node = static_cast<int>(*v);
    if (auto res = read_text_file(p / "resource"); res.ok)
      g.bar1_bytes = nvidia_bar1_size(parse_pci_resource(res.text));
    out.gpus.push_back(std::move(g));
  }
  out.reason = out.gpus.empty() ? "no PCI device with vendor 0x10de and class 0x03xxxx"
                                : fmt::format("{} NVIDIA GPU(s) in sysfs", out.gpus.size());
  return out;
}

std::optional<std::string> parse_nvidia_driver_version(std::string_view text) {
  auto first = text.substr(0, text.find('\n'));
  for (auto tok : split_whitespace(first))
    if (looks_like_version(tok)) return std::string(tok);
  return std::nullopt;
}

DriverVersion read_nvidia_driver_version(const std::filesystem::path& root) {
  DriverVersion d;
  auto f = read_text_file(under_root(root, "/proc/driver/nvidia/version"));
  if (!f.ok) {
    d.reason = f.missing ? "/proc/driver/nvidia/version does not exist: the NVIDIA kernel driver "
                           "is not loaded"
                         : f.error;
    return d;
  }
  d.version = parse_nvidia_driver_version(f.text);
  d.reason = d.version ? "/proc/driver/nvidia/version"
                       : "/proc/driver/nvidia/version has no version number on its first line";
  return d;
}

}  // namespace ferry::platform
