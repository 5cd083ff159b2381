// Test helper: a throw-away directory tree standing in for "/" (files, directories and relative
// symlinks, as sysfs has). The committed captures are test_data("platform") (test_data.h).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace ferry::platform::testing {

class FakeTree {
 public:
  FakeTree() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ferry-platform-XXXXXX").string();
    root_ = ::mkdtemp(tmpl.data());
  }
  ~FakeTree() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  FakeTree(const FakeTree&) = delete;
  FakeTree& operator=(const FakeTree&) = delete;

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path at(std::string_view rel) const { return root_ / rel; }

  void write(std::string_view rel, std::string_view text) const {
    auto p = at(rel);
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
  }
  void mkdir(std::string_view rel) const { std::filesystem::create_directories(at(rel)); }
  // A symlink at `rel` pointing to `target` (relative to the link's directory, as sysfs does).
  void link(std::string_view rel, std::string_view target) const {
    auto p = at(rel);
    std::filesystem::create_directories(p.parent_path());
    std::filesystem::create_directory_symlink(target, p);
  }
  // A PCI function directory under sys/devices with its /sys/bus/pci/devices link.
  void pci(std::string_view devices_path, std::string_view vendor = "0x1234",
           std::string_view cls = "0x010802", int numa = -1) const {
    std::string dir = "sys/devices/" + std::string(devices_path);
    mkdir(dir);
    write(dir + "/vendor", std::string(vendor) + "\n");
    write(dir + "/class", std::string(cls) + "\n");
    write(dir + "/numa_node", std::to_string(numa) + "\n");
    auto bdf = std::filesystem::path(devices_path).filename().string();
    link("sys/bus/pci/devices/" + bdf, "../../../devices/" + std::string(devices_path));
  }
  // A block device: its directory below a PCI function and the sys/dev/block link.
  void block(std::string_view devices_path, std::string_view majmin) const {
    mkdir("sys/devices/" + std::string(devices_path));
    link("sys/dev/block/" + std::string(majmin), "../../devices/" + std::string(devices_path));
  }

 private:
  std::filesystem::path root_;
};

}  // namespace ferry::platform::testing
