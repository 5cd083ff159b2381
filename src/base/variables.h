// The registry of every environment variable ferry reads of its own (FERRY_*) or of KvikIO's
// (KVIKIO_*): each reader names its entry here instead of spelling the variable, so the settings'
// misspelling warning knows them all. Third parties' variables (AWS_*, CURL_CA_BUNDLE, proxies,
// CUFILE_*) are theirs and stay out. Constants and a getenv: thread-safe as getenv is.
#pragma once

#include <array>
#include <cstdlib>
#include <string_view>

namespace ferry::base {

struct Variable {
  const char* env;
  // KvikIO's names for the same thing, read when `env` is unset (docs/kvikio.md). nullptr: none.
  std::array<const char*, 2> kvikio = {nullptr, nullptr};
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
// The remote policy (src/remote/remote_seam.cc, docs/remote.md). KvikIO counts attempts, not
// retries, and times the whole GET: the reader converts.
inline constexpr Variable kRemoteRetries{"FERRY_REMOTE_RETRIES",
                                         {"KVIKIO_HTTP_MAX_ATTEMPTS", nullptr}};
inline constexpr Variable kRemoteTimeout{"FERRY_REMOTE_TIMEOUT"};
inline constexpr Variable kRemoteDeadline{"FERRY_REMOTE_DEADLINE",
                                          {"KVIKIO_HTTP_TIMEOUT", nullptr}};
inline constexpr Variable kRemoteRetryStatuses{"KVIKIO_HTTP_STATUS_CODES"};
// The published counters (src/stats/, docs/stats.md).
inline constexpr Variable kStatsPublish{"FERRY_STATS_PUBLISH"};
inline constexpr Variable kStatsDir{"FERRY_STATS_DIR"};
// The libraries ferry dlopens (docs/install.md, docs/remote.md): another file for each.
inline constexpr Variable kCudaLibrary{"FERRY_CUDA_LIBRARY"};
inline constexpr Variable kCufileLibrary{"FERRY_CUFILE_LIBRARY"};
inline constexpr Variable kCurlLibrary{"FERRY_CURL_LIBRARY"};
inline constexpr Variable kCryptoLibrary{"FERRY_CRYPTO_LIBRARY"};

inline constexpr std::array<const Variable*, 18> kVariables{
    &kCompatMode,    &kRequire,       &kTaskSize,         &kGdsThreshold,
    &kNthreads,      &kHostNthreads,  &kBounceBufferSize, &kHostLoad,
    &kRemoteRetries, &kRemoteTimeout, &kRemoteDeadline,   &kRemoteRetryStatuses,
    &kStatsPublish,  &kStatsDir,      &kCudaLibrary,      &kCufileLibrary,
    &kCurlLibrary,   &kCryptoLibrary};

// The value of `name`, or nullptr when it is unset or empty (an empty variable means unset).
inline const char* value_of(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}
inline const char* value_of(const Variable& var) { return value_of(var.env); }

}  // namespace ferry::base
