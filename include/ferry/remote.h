// Remote sources: a File, a checkpoint or `ferry read` given an http://, https:// or s3:// URL
// reads the object by ranged GETs through libcurl, loaded at run time (docs/remote.md). This
// says whether that is possible in this process. Thread-safe.
#pragma once

#include <string>

namespace ferry {

struct RemoteSupport {
  bool available = false;
  // "libcurl 7.88.1 (OpenSSL/3.0.19)", or why remote sources are unavailable.
  std::string description;
};

// Loads libcurl on first call (FERRY_CURL_LIBRARY names another file).
RemoteSupport remote_support();

}  // namespace ferry
