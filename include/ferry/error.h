// ferry's error model: exceptions from one small hierarchy rooted at ferry::Error. Every message
// names the operation and the file, offset, length or setting at fault. Futures carry these
// exceptions to whoever waits on them. The types are immutable and safe to copy across threads.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace ferry {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A setting or size string that does not parse: names the setting, the value and the accepted
// forms. Never replaced by a default.
class SettingError : public Error {
 public:
  SettingError(std::string setting, std::string value, const std::string& message);
  const std::string& setting() const { return setting_; }
  const std::string& value() const { return value_; }

 private:
  std::string setting_;
  std::string value_;
};

// A failed system call on a file. `bytes_done` is what reached the file (writes) or the buffer
// (reads) before the failure; it is never reported as success.
class IoError : public Error {
 public:
  IoError(int err, std::string op, std::string path, std::uint64_t offset, std::uint64_t length,
          std::uint64_t bytes_done = 0, const std::string& detail = {});
  int error_code() const { return errno_; }
  const std::string& op() const { return op_; }
  const std::string& path() const { return path_; }
  std::uint64_t offset() const { return offset_; }
  std::uint64_t length() const { return length_; }
  std::uint64_t bytes_done() const { return bytes_done_; }
  // The same error with a new `bytes_done`, for a request that gathers its tasks' progress.
  IoError with_bytes_done(std::uint64_t bytes_done) const;

 private:
  int errno_;
  std::string op_;
  std::string path_;
  std::uint64_t offset_;
  std::uint64_t length_;
  std::uint64_t bytes_done_;
  std::string detail_;
};

// A CUDA driver failure, or no driver at all (code 0).
class CudaError : public Error {
 public:
  CudaError(const std::string& message, int code) : Error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// A request that would take a path the caller's strict mode forbids; the message says why.
class RouteError : public Error {
 public:
  using Error::Error;
};

}  // namespace ferry
