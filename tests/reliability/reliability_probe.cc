// A small program the reliability tests run in a child process, for what cannot be tested in
// the test process itself: settings read from the environment (once per process), settings that
// bypass the parsers, and exit with requests in flight.
//   reliability_probe settings                    print the settings or the SettingError
//   reliability_probe read FILE                   read FILE through ferry
//   reliability_probe override FIELD N FILE [direct]  read FILE with SettingsOverride::FIELD = N
//   reliability_probe exit-return|exit-call|exit-static FILE  leave with reads in flight
// Exit codes: 0 success, 3 SettingError, 4 other ferry::Error, 2 usage.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ferry/ferry.h"

namespace {

using ferry::File;
using ferry::IoFuture;

int read_all(File& f) {
  std::vector<char> buf(f.size() + 1);
  std::size_t n = f.read(buf.data(), buf.size(), 0);
  std::printf("read %zu bytes\n", n);
  return 0;
}

int override_and_read(const std::string& field, const char* value, const char* path, bool direct) {
  ferry::FileOptions options;
  options.direct = direct;
  std::size_t v = std::strtoull(value, nullptr, 10);
  if (field == "task_size") options.settings.task_size = v;
  if (field == "nthreads") options.settings.nthreads = v;
  if (field == "bounce_buffer_size") options.settings.bounce_buffer_size = v;
  File f(path, "r", options);
  std::vector<char> buf(f.size() + 1);
  // Unaligned, so that O_DIRECT goes through the staging buffers.
  std::size_t n = f.read(buf.data() + 1, buf.size() - 1, 1);
  std::printf("read %zu bytes\n", n);
  return 0;
}

// Many small tasks on a few threads, so that reads are still running when the process leaves.
// Each read has its own buffer; all are leaked, as a program that exits without waiting would.
void start_reads(File& f) {
  auto* futures = new std::vector<IoFuture>;
  for (int i = 0; i < 16; ++i) {
    auto* buf = new std::vector<char>(f.size());
    futures->push_back(f.pread(buf->data(), buf->size(), 0));
  }
}

File* leaked_file(const char* path) {
  ferry::FileOptions options;
  options.settings.set("task_size", "4KiB");
  options.settings.set("nthreads", "2");
  return new File(path, "r", options);
}

struct StaticReads {
  std::unique_ptr<File> file;
  std::vector<std::vector<char>> bufs;
  std::vector<IoFuture> futures;
};
StaticReads g_static;

int run(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "settings") {
    ferry::Settings s = ferry::settings();
    std::printf("task_size=%zu nthreads=%zu\n", s.task_size, s.nthreads);
    return 0;
  }
  if (mode == "read" && argc == 3) {
    File f(argv[2]);
    return read_all(f);
  }
  if (mode == "override" && argc >= 5) {
    return override_and_read(argv[2], argv[3], argv[4], argc > 5);
  }
  if ((mode == "exit-return" || mode == "exit-call") && argc == 3) {
    start_reads(*leaked_file(argv[2]));
    std::printf("leaving with reads in flight\n");
    std::fflush(stdout);
    if (mode == "exit-call") std::exit(0);
    return 0;
  }
  if (mode == "exit-static" && argc == 3) {
    // Static destructors wait for these futures while the pool threads still run.
    g_static.file.reset(leaked_file(argv[2]));
    g_static.bufs.assign(16, std::vector<char>(g_static.file->size()));
    for (std::vector<char>& buf : g_static.bufs) {
      g_static.futures.push_back(g_static.file->pread(buf.data(), buf.size()));
    }
    std::printf("leaving with reads in flight\n");
    return 0;
  }
  std::fprintf(stderr, "usage: see reliability_probe.cc\n");
  return 2;
}

}  // namespace

// The exit-* modes leak their File and futures on purpose; LeakSanitizer stays quiet for them.
extern "C" int __lsan_is_turned_off() { return 1; }

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ferry::SettingError& e) {
    std::printf("SettingError: %s\n", e.what());
    return 3;
  } catch (const ferry::Error& e) {
    std::printf("Error: %s\n", e.what());
    return 4;
  }
}
