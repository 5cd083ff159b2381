// Safetensors header parsing at mixture-of-experts scale (issue 30, finding 5): a header of N
// tensors (default 1,000,000, named like "l12.e87.w" to fit the format's 100 MB
// header limit) parsed and validated by checkpoint::parse_file_prefix, best of a few runs, in
// memory (no I/O: this measures the parser alone). One JSON line on stdout.
// Usage: ferry_header_bench [--tensors N] [--runs N]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>

#include "bench_util.h"
#include "checkpoint/safetensors_header.h"

int main(int argc, char** argv) {
  using ferry::bench::arg;
  const std::uint64_t tensors = std::stoull(arg(argc, argv, "--tensors", "1000000"));
  const int runs = std::stoi(arg(argc, argv, "--runs", "3"));
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::uint64_t offset = 0;
  for (std::uint64_t i = 0; i < tensors; ++i) {
    const std::uint64_t rows = 1 + i % 7;
    json += fmt::format(
        ",\"l{}.e{}.w\":{{\"dtype\":\"BF16\",\"shape\":[{},"
        "8],\"data_offsets\":[{},{}]}}",
        i / 128, i % 128, rows, offset, offset + rows * 16);
    offset += rows * 16;
  }
  json += "}";
  std::string prefix(8, '\0');
  for (int b = 0; b < 8; ++b) prefix[b] = static_cast<char>((json.size() >> (8 * b)) & 0xff);
  prefix += json;
  const std::uint64_t file_size = prefix.size() + offset;
  // CPU time beside wall time: on a shared machine the wall time measures the neighbours.
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  double best = 1e9, best_cpu = 1e9;
  std::size_t parsed = 0;
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu0 = cpu_now();
    parsed =
        ferry::checkpoint::parse_file_prefix(prefix, file_size, "bench.safetensors").tensors.size();
    best_cpu = std::min(best_cpu, cpu_now() - cpu0);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  fmt::print(
      "{{\"tensors\": {}, \"header_bytes\": {}, \"seconds\": {:.4f}, \"cpu_seconds\": {:.4f}, "
      "\"mb_per_s\": {:.1f}}}\n",
      parsed, json.size(), best, best_cpu, json.size() / best / 1e6);
  return parsed == tensors ? 0 : 1;
}
