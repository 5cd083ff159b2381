// Remote sources: a File, a checkpoint or `ferry read` given an http://, https:// or s3:// URL
// reads the object by ranged GETs through libcurl, loaded at run time (docs/remote.md). This
// says whether that is possible in this process. Thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

struct RemoteSupport {
  bool available = false;
  // "libcurl 7.88.1 (OpenSSL/3.0.19)", or why remote sources are unavailable.
  std::string description;
};

// Loads libcurl on first call (FERRY_CURL_LIBRARY names another file).
RemoteSupport remote_support();

// A path or URL as ferry's messages, reports and outputs show it: a URL (any scheme://) without
// its query and fragment ("?..." in their place: a presigned URL's signature and credential lie
// there) and without user:password@; a local path unchanged. Every URL ferry prints goes through
// this.
std::string shown_path(std::string_view path);

// Whether `path` names a remote object (http://, https://, s3://, the scheme in any case) rather
// than a local file.
bool is_remote_url(std::string_view path);

// How a remote object's GETs are retried, read when the object is opened. A field left empty
// takes its variable, then KvikIO's, then ferry's default:
//   retries         FERRY_REMOTE_RETRIES, KVIKIO_HTTP_MAX_ATTEMPTS - 1, 8 (0..100)
//   stall_seconds   FERRY_REMOTE_TIMEOUT, 30: seconds without a byte before a request is abandoned
//                   and retried (1..3600)
//   request_seconds FERRY_REMOTE_DEADLINE, KVIKIO_HTTP_TIMEOUT, 0: seconds one request (a HEAD or
//                   a GET, each attempt) may take in all before it is abandoned and retried, as
//                   KvikIO's http_timeout (CURLOPT_TIMEOUT); 0: no bound (0..86400)
//   retry_statuses  KVIKIO_HTTP_STATUS_CODES ("429,500"), 429 500 502 503 504 (100..599)
// Resets and stalls are retried whatever the statuses. ferry.kvikio's http_* settings set it.
struct RemotePolicy {
  std::optional<int> retries;
  std::optional<long> stall_seconds;
  std::optional<long> request_seconds;
  std::optional<std::vector<int>> retry_statuses;
};

// Sets the process's policy for objects opened from now on (SettingError, naming the field, for
// a value out of range; nothing changes then). Thread-safe.
void set_remote_policy(const RemotePolicy& policy);
// The policy as set (fields left empty stay empty).
RemotePolicy remote_policy();
// What an object opened now gets: every field filled, from the policy, the variables or the
// defaults (SettingError for a variable out of range).
RemotePolicy effective_remote_policy();

}  // namespace ferry
