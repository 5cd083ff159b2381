// `ferry bench --plot FILE`: the results drawn by python/ferry/plot.py (built into the tool) with
// a Python interpreter that has matplotlib. Single-threaded use.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ferry::cli {

// The checks made before any benchmark runs, so that minutes of measuring never end in "cannot
// draw": `output`'s suffix (.png, .svg or .pdf), its folder, and an interpreter that imports
// matplotlib (FERRY_PYTHON if set, else python3 on PATH, else /usr/bin/python3). Returns the
// interpreter; throws ferry::Error naming what is missing.
std::string check_plot(const std::string& output);

// Where the JSON lines of a plot go: `output` with its suffix replaced by .jsonl.
std::string plot_results_path(const std::string& output);

// Writes `records` (one JSON object per line) to plot_results_path(output), then draws them into
// `output` with `python`. Throws ferry::Error when the drawing fails (the results stay written).
void draw_plot(const std::string& python, const std::string& output,
               const std::vector<nlohmann::json>& records);

}  // namespace ferry::cli
