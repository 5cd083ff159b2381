#include "platform/p2pdma.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "platform/text_file.h"

namespace ferry::platform {

std::optional<bool> parse_kernel_config_p2pdma(std::string_view config) {
  for (auto raw : split_lines(config)) {
    auto line = trim(raw);
    if (line == "CONFIG_PCI_P2PDMA=y") return true;
    if (line == "# CONFIG_PCI_P2PDMA is not set") return false;
  }
  return std::nullopt;
}

P2pdmaState read_p2pdma(const std::filesystem::path& root) {
  P2pdmaState s;
  std::error_code ec;
  auto dir = under_root(root, "/sys/bus/pci/devices");
  if (std::filesystem::is_directory(dir, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (std::filesystem::is_directory(e.path() / "p2pmem", ec))
        s.p2pmem_devices.push_back(e.path().filename());
    std::sort(s.p2pmem_devices.begin(), s.p2pmem_devices.end());
  }
  std::string config_words = "no kernel config found";
  auto release = read_text_file(under_root(root, "/proc/sys/kernel/osrelease"));
  if (release.ok) {
    auto name = fmt::format("/boot/config-{}", trim(release.text));
    auto cfg = read_text_file(under_root(root, name), std::size_t{8} << 20);
    if (cfg.ok) {
      s.kernel_config = parse_kernel_config_p2pdma(cfg.text);
      config_words = s.kernel_config ? fmt::format("{}: CONFIG_PCI_P2PDMA {}", name,
                                                   *s.kernel_config ? "=y" : "is not set")
                                     : fmt::format("{} does not mention CONFIG_PCI_P2PDMA", name);
    } else {
      config_words = fmt::format("no {}", name);
    }
  }
  if (s.kernel_config && !*s.kernel_config) {
    s.available = false;
    s.how = fmt::format("off: {}", config_words);
  } else if (!s.p2pmem_devices.empty()) {
    s.available = true;
    s.how =
        fmt::format("p2pmem published by {}; {}", fmt::join(s.p2pmem_devices, ", "), config_words);
  } else if (s.kernel_config) {
    s.how = fmt::format(
        "kernel built with P2PDMA ({}), no device publishes p2pmem; whether cuFile "
        "can use it for GPU memory is not shown",
        config_words);
  } else {
    s.how = fmt::format("unknown: no device publishes p2pmem and {}", config_words);
  }
  return s;
}

}  // namespace ferry::platform
