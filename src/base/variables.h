// The registry of every environment variable ferry reads of its own (FERRY_*) or of KvikIO's
// (KVIKIO_*): each reader names its entry here instead of spelling the variable, so the settings'
// misspelling warning knows them all and `ferry check` lists them all. Variables that are not
// ferry's are read where they are used and stay out: AWS_* (remote_url.cc), CURL_CA_BUNDLE,
// SSL_CERT_FILE and the proxies (libcurl's, http_get.cc), CUFILE_* (cuFile's, cufile_stats.cc).
// Constants, and readers thread-safe as getenv is.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::base {

// How a variable read below core is checked (core's settings parse their own: settings.cc).
enum class Form { kSetting, kWholeNumber, kHttpStatuses, kSwitch, kText };

struct Variable {
  const char* env;
  // KvikIO's names for the same thing, read when `env` is unset (docs/kvikio.md). nullptr: none.
  std::array<const char*, 2> kvikio = {nullptr, nullptr};
  // The variables that rooms below core read themselves (the remote policy, the statistics, the
  // libraries): their name in describe_settings(), form, default as shown, and limits. A KvikIO
  // name is at least 1 and counts `kvikio_extra` more than ferry's (attempts, not retries).
  const char* name = nullptr;
  Form form = Form::kSetting;
  const char* fallback = nullptr;
  long low = 0;
  long high = 0;
  long kvikio_extra = 0;
};

// The settings (src/core/settings.cc, docs/settings.md).
inline constexpr Variable kCompatMode{"FERRY_COMPAT_MODE", {"KVIKIO_COMPAT_MODE", nullptr}};
inline constexpr Variable kRequire{"FERRY_REQUIRE"};
inline constexpr Variable kTaskSize{"FERRY_TASK_SIZE", {"KVIKIO_TASK_SIZE", nullptr}};
inline constexpr Variable kGdsThreshold{"FERRY_GDS_THRESHOLD", {"KVIKIO_GDS_THRESHOLD", nullptr}};
// KvikIO has one thread pool for every kind of memory: its count sets both of ferry's.
inline constexpr Variable kNthreads{"FERRY_NTHREADS", {"KVIKIO_NTHREADS", "KVIKIO_NUM_THREADS"}};
inline constexpr Variable kHostNthreads{"FERRY_HOST_NTHREADS",
                                        {"KVIKIO_NTHREADS", "KVIKIO_NUM_THREADS"}};
inline constexpr Variable kBounceBufferSize{"FERRY_BOUNCE_BUFFER_SIZE",
                                            {"KVIKIO_BOUNCE_BUFFER_SIZE", nullptr}};
inline constexpr Variable kHostLoad{"FERRY_HOST_LOAD"};
// clang-format off
// The remote policy (src/remote/remote_seam.cc, docs/remote.md). KvikIO counts attempts, not
// retries, and times the whole GET, as ferry's deadline does.
inline constexpr Variable kRemoteRetries{"FERRY_REMOTE_RETRIES", {"KVIKIO_HTTP_MAX_ATTEMPTS"},
                                         "remote_retries", Form::kWholeNumber, "8", 0, 100, 1};
inline constexpr Variable kRemoteTimeout{"FERRY_REMOTE_TIMEOUT", {}, "remote_timeout",
                                         Form::kWholeNumber, "30", 1, 3600};
inline constexpr Variable kRemoteDeadline{"FERRY_REMOTE_DEADLINE", {"KVIKIO_HTTP_TIMEOUT"},
                                          "remote_deadline", Form::kWholeNumber, "0", 0, 86400};
inline constexpr Variable kRemoteRetryStatuses{"KVIKIO_HTTP_STATUS_CODES", {},
                                               "remote_retry_statuses", Form::kHttpStatuses,
                                               "429,500,502,503,504"};
// The published counters (src/stats/, docs/stats.md).
inline constexpr Variable kStatsPublish{"FERRY_STATS_PUBLISH", {}, "stats_publish", Form::kSwitch,
                                        "on"};
inline constexpr Variable kStatsDir{"FERRY_STATS_DIR", {}, "stats_dir", Form::kText, "/dev/shm"};
// The libraries ferry dlopens (docs/install.md, docs/remote.md): another file for each.
inline constexpr Variable kCudaLibrary{"FERRY_CUDA_LIBRARY", {}, "cuda_library", Form::kText,
                                       "libcuda.so.1"};
inline constexpr Variable kCufileLibrary{"FERRY_CUFILE_LIBRARY", {}, "cufile_library", Form::kText,
                                         "libcufile.so.0"};
inline constexpr Variable kCurlLibrary{"FERRY_CURL_LIBRARY", {}, "curl_library", Form::kText,
                                       "libcurl.so.4"};
inline constexpr Variable kCryptoLibrary{"FERRY_CRYPTO_LIBRARY", {}, "crypto_library", Form::kText,
                                         "libcrypto.so.3"};
// clang-format on

inline constexpr std::array<const Variable*, 18> kVariables{
    &kCompatMode,    &kRequire,       &kTaskSize,         &kGdsThreshold,
    &kNthreads,      &kHostNthreads,  &kBounceBufferSize, &kHostLoad,
    &kRemoteRetries, &kRemoteTimeout, &kRemoteDeadline,   &kRemoteRetryStatuses,
    &kStatsPublish,  &kStatsDir,      &kCudaLibrary,      &kCufileLibrary,
    &kCurlLibrary,   &kCryptoLibrary};

// A variable read below core, checked: `value` as shown (a whole number, statuses joined by
// commas, on or off, the text), from `env` (its FERRY_* name or KvikIO's; nullptr: the default).
struct Reading {
  std::string value;
  const char* env = nullptr;
};
// Reads `var` (a Form other than kSetting): its FERRY_* variable, else KvikIO's, else its
// default. A malformed value is the SettingError that names the variable, its text and the forms
// it takes, as every setting's is.
Reading read(const Variable& var);
long read_number(const Variable& var);  // of a kWholeNumber
// "429, 500,503" -> {429, 500, 503}, each 100 to 599; SettingError naming `env` and `text`.
std::vector<int> parse_http_statuses(std::string_view text, std::string_view env);

}  // namespace ferry::base
