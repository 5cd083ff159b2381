// Appends (mode "a", issue 30): what ordering them across Files and processes with an OFD lock
// costs. P processes each append N blocks of SIZE bytes through a File of their own to one file
// (each process one thread); prints one JSON object: the appends per second, GB/s, and whether
// every byte survived (the file's size against P * N * SIZE).
//   ferry_append_bench --file /tmp/ferry-append.bin --processes 2 --count 40 --size 8388608
#include <ferry/ferry.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "bench_util.h"

int main(int argc, char** argv) {
  using ferry::bench::arg;
  const std::string path = arg(argc, argv, "--file", "/tmp/ferry-append.bin");
  const int processes = std::stoi(arg(argc, argv, "--processes", "2"));
  const int count = std::stoi(arg(argc, argv, "--count", "40"));
  const std::size_t size = std::stoull(arg(argc, argv, "--size", "8388608"));
  ::unlink(path.c_str());
  const auto t0 = ferry::bench::Clock::now();
  std::vector<pid_t> children;
  for (int p = 0; p < processes; ++p) {
    const pid_t c = fork();
    if (c == 0) {
      std::vector<char> block(size, static_cast<char>('a' + p));
      ferry::File f(path, "a");
      for (int i = 0; i < count; ++i) f.append(block.data(), size);
      f.close();
      _exit(0);
    }
    children.push_back(c);
  }
  bool ok = true;
  for (pid_t c : children) {
    int status = 0;
    waitpid(c, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  const double s = ferry::bench::since(t0);
  struct stat st {};
  ::stat(path.c_str(), &st);
  const double total = static_cast<double>(processes) * count * static_cast<double>(size);
  fmt::print(
      "{{\"processes\": {}, \"count\": {}, \"size\": {}, \"seconds\": {:.4f}, "
      "\"appends_per_s\": {:.0f}, \"gbps\": {:.3f}, \"bytes\": {}, \"expected\": {:.0f}, "
      "\"ok\": {}}}\n",
      processes, count, size, s, processes * count / s, total / s / 1e9, st.st_size, total,
      ok && static_cast<double>(st.st_size) == total ? "true" : "false");
  ::unlink(path.c_str());
  return 0;
}
