#include "common.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "progress.h"

namespace ferry::cli {

void add_memory_options(CLI::App& cmd, MemoryChoice& choice, bool several_gpus) {
  CLI::Option* gpu = nullptr;
  if (several_gpus) {
    gpu = cmd.add_option("--gpu", choice.gpu_list,
                         "GPU ordinal to use (default: 0 when a GPU exists); several (0,1) or "
                         "all: the range is split into one contiguous part per GPU, read at once")
              ->type_name("N|N,M,...|all")
              ->check(
                  [](const std::string& text) {
                    try {
                      parse_gpu_list(text);
                      return std::string();
                    } catch (const std::exception& e) {
                      return std::string(e.what());
                    }
                  },
                  "", "a GPU ordinal, a list such as 0,1, or all");
  } else {
    gpu = cmd.add_option("--gpu", choice.gpu, "GPU ordinal to use (default: 0 when a GPU exists)")
              ->check(whole_number("a GPU ordinal", 0, 9999));
  }
  auto* host = cmd.add_flag("--host", choice.host, "Use pageable host memory");
  auto* pinned = cmd.add_flag("--pinned", choice.pinned, "Use pinned host memory (needs a driver)");
  gpu->excludes(host)->excludes(pinned);
  host->excludes(pinned);
}

void add_settings_options(CLI::App& cmd, SettingsFlags& flags) {
  cmd.add_option("--task-size", flags.task_size, "Task size, e.g. 4MiB (FERRY_TASK_SIZE)");
  cmd.add_option("--threads", flags.threads,
                 "Worker threads, for GPU and host memory alike (FERRY_NTHREADS for GPU memory, "
                 "FERRY_HOST_NTHREADS for host memory)");
  cmd.add_option("--compat", flags.compat, "compat mode: auto, on or off (FERRY_COMPAT_MODE)");
  cmd.add_option("--require", flags.require, "Strict mode: any, cufile or gds (FERRY_REQUIRE)");
  cmd.add_option("--bounce-size", flags.bounce, "Bounce buffer size (FERRY_BOUNCE_BUFFER_SIZE)");
  cmd.add_flag("--direct", flags.direct, "Use O_DIRECT (falls back to buffered I/O with a reason)");
}

FileOptions file_options(const SettingsFlags& flags) {
  FileOptions options;
  options.direct = flags.direct;
  if (!flags.task_size.empty())
    options.settings.task_size = parse_size(flags.task_size, "--task-size");
  if (!flags.threads.empty()) {
    options.settings.nthreads = parse_count(flags.threads, "--threads");
    options.settings.host_nthreads = options.settings.nthreads;
  }
  if (!flags.compat.empty())
    options.settings.compat_mode = parse_compat_mode(flags.compat, "--compat");
  if (!flags.require.empty()) options.settings.require = parse_require(flags.require, "--require");
  if (!flags.bounce.empty()) {
    options.settings.bounce_buffer_size = parse_size(flags.bounce, "--bounce-size");
  }
  return options;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

bool is_gpu_ordinal(const std::string& text) {
  return !text.empty() && text.size() <= 4 &&
         std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

GpuList parse_gpu_list(const std::string& text) {
  GpuList list;
  if (text == "all") {
    list.all = true;
    return list;
  }
  for (const std::string& item : split_list(text)) {
    if (!is_gpu_ordinal(item)) {
      throw Error(fmt::format("'{}' is not a GPU ordinal, a list such as 0,1, or all", text));
    }
    const int ordinal = std::stoi(item);
    if (std::find(list.ordinals.begin(), list.ordinals.end(), ordinal) != list.ordinals.end()) {
      throw Error(fmt::format("GPU {} is named twice in '{}'", ordinal, text));
    }
    list.ordinals.push_back(ordinal);
  }
  return list;
}

std::vector<int> resolve_gpus(const GpuList& list) {
  CudaStatus cuda = cuda_status();
  if (!cuda.available) throw CudaError(cuda.why_not, 0);  // as --gpu 0 does
  const int count = static_cast<int>(cuda.gpus.size());
  if (list.all) {
    if (count == 0) throw CudaError("no GPU: the CUDA driver sees none", 0);
    std::vector<int> all;
    for (int i = 0; i < count; ++i) all.push_back(i);
    return all;
  }
  for (int ordinal : list.ordinals) {
    if (ordinal >= count) {
      throw Error(
          fmt::format("--gpu: GPU {} does not exist: this machine has {} GPU(s)", ordinal, count));
    }
  }
  return list.ordinals;
}

ChosenMemory choose_memory_or_throw(const ferry::MemoryChoice& choice) {
  ChosenMemory chosen = choose_memory(choice);
  if (chosen.failure) throw CudaError(*chosen.failure, 0);
  return chosen;
}

nlohmann::json memory_json(const ChosenMemory& target) {
  nlohmann::json j = {{"memory", is_gpu(target.memory.kind) ? "gpu" : "host"},
                      {"memory_kind", to_string(target.memory.kind)},
                      {"device", target.memory.device}};
  if (!target.note.empty()) j["note"] = target.note;
  return j;
}

namespace {

struct Part {
  const Buffer* buffer;
  std::size_t offset;
  std::size_t size;
};

std::string sha256_of(const std::vector<Part>& parts) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    throw Error("OpenSSL: SHA-256 initialisation failed");
  }
  for (const auto& [buffer, offset, size] : parts) {
    if (size == 0) continue;
    if (!is_gpu(buffer->kind())) {
      EVP_DigestUpdate(ctx.get(), static_cast<const char*>(buffer->data()) + offset, size);
      continue;
    }
    constexpr std::size_t kChunk = std::size_t{64} << 20;
    std::vector<unsigned char> host(std::min(kChunk, size));
    for (std::size_t off = 0; off < size; off += kChunk) {
      std::size_t n = std::min(kChunk, size - off);
      buffer->copy_to_host(host.data(), n, offset + off);
      EVP_DigestUpdate(ctx.get(), host.data(), n);
    }
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

}  // namespace

std::string sha256(const Buffer& buffer, std::size_t size, std::size_t offset) {
  return sha256_of({{&buffer, offset, size}});
}

std::string sha256(const std::vector<std::pair<const Buffer*, std::size_t>>& parts) {
  std::vector<Part> all;
  for (const auto& [buffer, size] : parts) all.push_back({buffer, 0, size});
  return sha256_of(all);
}

void fill_pattern(Buffer& buffer, const std::string& pattern, std::uint64_t seed) {
  if (pattern == "zero") {
    buffer.fill(0);
    return;
  }
  if (pattern != "random") {
    throw Error(fmt::format("invalid --pattern '{}': expected random or zero", pattern));
  }
  // splitmix64: fast, deterministic, and different for every 8-byte word.
  auto generate = [](std::uint64_t* words, std::size_t count, std::uint64_t index) {
    for (std::size_t i = 0; i < count; ++i, ++index) {
      std::uint64_t z = index * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      words[i] = z ^ (z >> 31);
    }
  };
  constexpr std::size_t kChunk = std::size_t{64} << 20;
  std::vector<std::uint64_t> host(std::min(kChunk, buffer.size()) / 8 + 1);
  std::uint64_t index = seed << 40;
  for (std::size_t off = 0; off < buffer.size(); off += kChunk) {
    std::size_t n = std::min(kChunk, buffer.size() - off);
    generate(host.data(), n / 8 + 1, index);
    index += n / 8 + 1;
    buffer.copy_from_host(host.data(), n, off);
  }
}

void wait_with_progress(const IoFuture& future, std::uint64_t total, const char* verb, bool show) {
  if (!show) {
    future.wait();
    return;
  }
  ProgressBar bar(verb, total, true);
  while (!future.wait_for(0.05)) bar.update(std::min(future.progress(), total));
}

namespace {

// The temporary file's name, for the signal handler.
char g_signal_temp[4096];

void remove_temp_and_die(int sig) {
  if (g_signal_temp[0] != 0) unlink(g_signal_temp);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void remove_on_signals(const std::string& path, std::initializer_list<int> signals) {
  if (path.size() >= sizeof g_signal_temp) return;
  std::memcpy(g_signal_temp, path.c_str(), path.size() + 1);
  struct sigaction act {};
  act.sa_handler = remove_temp_and_die;
  sigemptyset(&act.sa_mask);
  for (int sig : signals) sigaction(sig, &act, nullptr);
}

void forget_signal_temp() { g_signal_temp[0] = 0; }

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return secs(usage.ru_utime) + secs(usage.ru_stime);
}

double cpu_seconds_per_gib(double cpu_seconds, std::uint64_t bytes) {
  return bytes > 0 ? cpu_seconds / (static_cast<double>(bytes) / (1 << 30)) : 0;
}

std::string cpu_words(double cpu_seconds, std::uint64_t bytes) {
  if (bytes == 0) return fmt::format("{:.3f} CPU-s", cpu_seconds);
  return fmt::format("{:.3f} CPU-s/GiB", cpu_seconds_per_gib(cpu_seconds, bytes));
}

CLI::Validator whole_number(const std::string& what, long long low, long long high) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        long long value = 0;
        const char* end = text.data() + text.size();
        auto [at, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc() && at == end && value >= low && value <= high) return {};
        return fmt::format("must be {} from {} to {}, not '{}'", what, low, high, text);
      },
      fmt::format("{}..{}", low, high), fmt::format("{} from {} to {}", what, low, high));
}

CLI::Validator seconds_above_zero(double most) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        auto [at, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc() && at == end && std::isfinite(value) && value > 0 && value <= most)
          return {};
        return fmt::format("must be a number of seconds above 0 and at most {:g}, not '{}'", most,
                           text);
      },
      "SECONDS", fmt::format("a number of seconds above 0 and at most {:g}", most));
}

double gbps(std::uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

}  // namespace ferry::cli
