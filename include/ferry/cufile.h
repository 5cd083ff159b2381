// cuFile (GPUDirect Storage) as this process sees it, and optional buffer registration.
// ferry loads libcufile at run time (FERRY_CUFILE_LIBRARY overrides "libcufile.so.0") and opens
// its driver on the first request that needs it. cufile_status() says what loaded and why not;
// RegisteredBuffer pins a GPU buffer for cuFile for its lifetime. All functions are thread-safe;
// a RegisteredBuffer is move-only and must outlive the requests that use its memory.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ferry {

struct CufileStatus {
  std::string library;  // the path given to dlopen
  bool loaded = false;
  std::string load_error;                    // why the library is unusable
  std::vector<std::string> missing_symbols;  // required ones (then unusable), then optional ones
  int version = 0;                           // cuFileGetVersion(): 1150 for cuFile 1.15; 0 unknown
  std::string version_text;                  // "1.15" or "unknown"
  bool stats_layout_known = false;           // ferry can read this version's statistics
  bool driver_open_attempted = false;
  bool driver_open = false;
  bool compat_mode_refused = false;  // opened with compatibility refused (require=gds)
  int driver_error = 0;              // cuFile code of a failed cuFileDriverOpen (5001, ...)
  std::string driver_error_text;     // that failure in words, with what blocks it
  std::string stats_why_not;         // why layer 2 cannot be read; empty when it can

  std::string to_json() const;
};

// `open_driver` opens the driver if no request did yet (in the mode the current settings'
// require asks for), so the result says whether it opens.
CufileStatus cufile_status(bool open_driver = true);

// A buffer registered with cuFileBufRegister; deregistered on destruction or reset().
class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  ~RegisteredBuffer();
  RegisteredBuffer(RegisteredBuffer&& other) noexcept;
  RegisteredBuffer& operator=(RegisteredBuffer&& other) noexcept;
  RegisteredBuffer(const RegisteredBuffer&) = delete;
  RegisteredBuffer& operator=(const RegisteredBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool registered() const { return data_ != nullptr; }
  void reset();

 private:
  friend RegisteredBuffer register_buffer(void* data, std::size_t size, int flags);
  RegisteredBuffer(void* data, std::size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// Registers [data, data+size) (GPU memory) with cuFile. Requests into any part of it then pass
// cuFile the registered base and an offset. Throws ferry::Error naming the buffer and cuFile's
// reason (library missing, driver not open, cuFileBufRegister error).
RegisteredBuffer register_buffer(void* data, std::size_t size, int flags = 0);

}  // namespace ferry
