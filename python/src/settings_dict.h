// Settings as a Python dict of typed values: modes as strings, sizes and counts as ints. The
// keys are the C++ setting names; tests check them against describe_settings().
#pragma once

#include <pybind11/pybind11.h>

#include "ferry/settings.h"

namespace ferry::python {

inline pybind11::dict settings_dict(const Settings& s) {
  pybind11::dict d;
  d["compat_mode"] = to_string(s.compat_mode);
  d["require"] = to_string(s.require);
  d["task_size"] = s.task_size;
  d["gds_threshold"] = s.gds_threshold;
  d["nthreads"] = s.nthreads;
  d["host_nthreads"] = s.host_nthreads;
  d["bounce_buffer_size"] = s.bounce_buffer_size;
  d["host_load"] = to_string(s.host_load);
  return d;
}

}  // namespace ferry::python
