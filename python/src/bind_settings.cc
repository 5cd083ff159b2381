// Settings: typed reads, changes by name with C++'s own parsing (so errors read the same), and
// scopes. A scope is a ScopedSettings: it changes the settings of the thread that entered it, and
// exiting it (in any order) removes exactly its own changes.
#include <pybind11/stl.h>

#include <map>
#include <memory>

#include "bindings.h"
#include "ferry/settings.h"
#include "ferry/sizes.h"
#include "settings_dict.h"

namespace ferry::python {

namespace {

SettingsOverride parse(const std::map<std::string, std::string>& values) {
  SettingsOverride changes;
  for (const auto& [name, value] : values) changes.set(name, value);
  return changes;
}

class Scope {
 public:
  explicit Scope(const std::map<std::string, std::string>& values) : changes_(parse(values)) {}
  void enter() {
    if (active_) throw std::logic_error("ferry.settings: this scope is already entered");
    active_ = std::make_unique<ScopedSettings>(changes_);
  }
  void exit() {
    if (!active_) throw std::logic_error("ferry.settings: this scope was not entered");
    active_.reset();
  }

 private:
  SettingsOverride changes_;
  std::unique_ptr<ScopedSettings> active_;
};

}  // namespace

void bind_settings(py::module_& m) {
  using py::arg;
  m.def(
      "get_settings", [] { return settings_dict(settings()); },
      "This thread's settings (process-wide ones under its scopes) as {name: value}.");
  m.def(
      "set_settings",
      [](const std::map<std::string, std::string>& values) { set_settings(parse(values)); },
      arg("values"), "Changes process-wide settings; values are strings parsed as in C++.");
  m.def("describe_settings", [] {
    py::list rows;
    for (const SettingInfo& info : describe_settings()) {
      py::dict row;
      row["name"] = info.name;
      row["env"] = info.env;
      row["value"] = info.value;
      row["source"] = to_string(info.source);
      row["source_env"] = info.source_env;  // the variable it was read from: FERRY_* or KVIKIO_*
      row["kvikio_env"] = info.kvikio_env;
      row["error"] = info.error;  // a malformed variable's error; value is then the default
      row["environment_only"] = info.environment_only;  // the remote policy, stats, libraries
      rows.append(row);
    }
    return rows;
  });
  m.def("parse_size", &parse_size, arg("text"), arg("setting") = "size",
        "\"4MiB\" -> 4194304, \"5GB\" -> 5000000000; a SettingError names `setting`.");
  m.def("format_rate", &format_rate, arg("bytes_per_s"), "2.45e9 -> \"2.45 GB/s\".");
  m.def("format_size", py::overload_cast<std::uint64_t, bool>(&format_size), arg("bytes"),
        arg("rounded") = false, "4194304 -> \"4 MiB\" (exact); rounded: 4917248 -> \"4.69 MiB\".");

  py::class_<Scope>(m, "SettingsScope")
      .def(py::init<const std::map<std::string, std::string>&>(), arg("values"))
      .def("enter", &Scope::enter)
      .def("exit", &Scope::exit);
}

}  // namespace ferry::python
