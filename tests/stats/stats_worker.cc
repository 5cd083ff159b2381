// A process that reads through ferry on command, for the tests of `ferry stats -p` (its counters
// read from outside it). Prints "ready <pid>", then one line per command read from stdin:
//   read N SIZE     N reads of SIZE bytes into host memory, one after another -> "ok"
//   big SIZE        one read of SIZE bytes from offset 0 (several tasks, the pool) -> "ok"
//   spin SIZE       reads of SIZE bytes without end, in a thread of its own -> "ok"
//   stop            ends the spin -> "ok <reads done by the spin>"
//   publish 0|1     ferry::publish_stats() -> "ok <published> <path or why not>"
//   stats           -> "ok <ferry::stats() as JSON>"
//   exit            returns from main (a normal exit)
#include <ferry/ferry.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: stats_worker FILE\n");
    return 2;
  }
  ferry::File file(argv[1]);
  const std::uint64_t file_size = file.size();
  std::printf("ready %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> spun{0};
  std::thread spinner;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    try {
      if (cmd == "read") {
        std::size_t n = 0, size = 0;
        in >> n >> size;
        std::vector<unsigned char> buf(size);
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint64_t offset = (i * size) % (file_size - size + 1) / 4096 * 4096;
          if (file.read(buf.data(), size, offset) != size) throw std::runtime_error("short read");
        }
        std::printf("ok\n");
      } else if (cmd == "big") {
        std::size_t size = 0;
        in >> size;
        std::vector<unsigned char> buf(size);
        if (file.read(buf.data(), size, 0) != size) throw std::runtime_error("short read");
        std::printf("ok\n");
      } else if (cmd == "spin") {
        std::size_t size = 0;
        in >> size;
        stop = false;
        spinner = std::thread([&, size] {
          std::vector<unsigned char> buf(size);
          while (!stop.load()) {
            file.read(buf.data(), size, 0);
            spun.fetch_add(1);
          }
        });
        std::printf("ok\n");
      } else if (cmd == "stop") {
        stop = true;
        if (spinner.joinable()) spinner.join();
        std::printf("ok %llu\n", static_cast<unsigned long long>(spun.exchange(0)));
      } else if (cmd == "publish") {
        int on = 0;
        in >> on;
        ferry::PublishStatus s = ferry::publish_stats(on != 0);
        std::printf("ok %d %s\n", s.published ? 1 : 0,
                    s.published ? s.path.c_str() : s.why_not.c_str());
      } else if (cmd == "stats") {
        std::printf("ok %s\n", ferry::stats().to_json().c_str());
      } else if (cmd == "exit") {
        break;
      } else {
        std::printf("error unknown command %s\n", cmd.c_str());
      }
    } catch (const std::exception& e) {
      std::printf("error %s\n", e.what());
    }
    std::fflush(stdout);
  }
  stop = true;
  if (spinner.joinable()) spinner.join();
  return 0;
}
