// ferry.File's core and the request behind a ferry.Future (python/ferry/_file.py and _future.py
// wrap them). I/O runs with the GIL released. Every request is a Pending entry that owns the
// Python buffer until the request is over, and lets go of it as soon as someone sees it over;
// the File keeps its pending requests so that close() (and garbage collection) waits for them.
// One that ended in the submitting thread (a small one) lets go of it at once and is not kept.
// Waits run in short slices and check for signals between them, so Ctrl-C cancels a request.
#include <pybind11/stl.h>
#include <structmember.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <future>
#include <map>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "bindings.h"
#include "buffer_view.h"
#include "ferry/file.h"
#include "ferry/plan.h"
#include "ferry/printable.h"
#include "ferry/remote.h"
#include "settings_dict.h"

namespace ferry::python {

// "ferry: file_offset must be an int, not float" rather than pybind11's overload listing.
std::optional<std::uint64_t> index_arg(const py::handle& value, const char* name, bool none_ok) {
  if (value.is_none() && none_ok) return std::nullopt;
  if (PyLong_CheckExact(value.ptr())) {
    // The common case in one call (py::int_ comparisons cost 0.3 us of a 4 KiB read); a
    // negative or too large int goes on below, for its message.
    const unsigned long long n = PyLong_AsUnsignedLongLong(value.ptr());
    if (n != static_cast<unsigned long long>(-1) || PyErr_Occurred() == nullptr) return n;
    PyErr_Clear();
  }
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    throw py::type_error(std::string("ferry: ") + name + " must be an int, not " +
                         Py_TYPE(value.ptr())->tp_name);
  }
  py::int_ n = py::reinterpret_steal<py::int_>(index);
  if (n < py::int_(0)) {
    throw py::value_error(std::string("ferry: ") + name + " must be >= 0, not " +
                          py::str(n).cast<std::string>());
  }
  if (n > py::int_(UINT64_MAX)) {
    PyErr_SetString(PyExc_OverflowError,
                    (std::string("ferry: ") + name + " must be below 2**64, not " +
                     py::str(n).cast<std::string>())
                        .c_str());
    throw py::error_already_set();
  }
  return n.cast<std::uint64_t>();
}

std::string path_arg(const py::handle& path) {
  py::bytes encoded = py::module_::import("os").attr("fsencode")(path);
  std::string out = encoded;
  if (out.find('\0') != std::string::npos) throw py::value_error("embedded null byte");
  return out;
}

py::str path_str(const std::string& path) {
  return py::module_::import("os").attr("fsdecode")(py::bytes(path));
}

py::str text_str(const std::string& text) {
  PyObject* s =
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace");
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

namespace {

// How long a wait runs with the GIL released before it looks for signals: Ctrl-C raises
// KeyboardInterrupt within about this much (plus the tasks in flight).
constexpr double kSignalSlice = 0.05;
// Synchronous requests up to this size are File::read/write calls with the GIL released, without
// a Pending entry: a request of one task then runs in the caller's thread (a hand-off to a
// worker and back cost about 20 us here, 0.73x os.preadv at 1 MiB), a larger one on the workers.
// Larger requests wait in slices, so that Ctrl-C interrupts them; these take milliseconds.
constexpr std::size_t kSmallSync = std::size_t{4} << 20;
// Up to this size File::pwrite runs a request in the caller's thread itself (core::kSmallAsync).
constexpr std::size_t kSmallAsync = std::size_t{64} << 10;

struct Pending {
  std::shared_ptr<BufferView> buffer;  // null once the request is seen over
  IoFuture future;
  std::size_t nbytes = 0;
  Op op = Op::kRead;

  ~Pending() {
    if (future.valid() && !future.ready()) {
      py::gil_scoped_release release;
      future.wait();
    }
  }
  // Lets go of the buffer once the request is over (GIL held). A bytearray is resizable again
  // and an array dropped by the caller is freed now, not at the File's next request.
  void release_if_over() {
    if (buffer && (!future.valid() || future.ready())) buffer.reset();
  }

  // Waits up to `timeout` seconds (forever when none), in slices with the GIL released,
  // checking for signals between them. On a signal whose handler raises (KeyboardInterrupt),
  // cancels the request, waits for its tasks in flight (the buffer is not written after this
  // returns) and raises the handler's exception with `bytes_done` set to the bytes in place.
  // Returns false on timeout.
  bool wait(std::optional<double> timeout) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    while (true) {
      double slice = kSignalSlice;
      if (timeout) {
        double left = *timeout - std::chrono::duration<double>(Clock::now() - start).count();
        if (left <= 0) return future.ready();
        slice = std::min(slice, left);
      }
      bool ready;
      {
        py::gil_scoped_release release;
        ready = future.wait_for(slice);
      }
      if (ready) {
        release_if_over();
        return true;
      }
      if (PyErr_CheckSignals() != 0) interrupted();
    }
  }

  [[noreturn]] void interrupted() {
    py::error_already_set signal;  // takes the handler's exception
    future.cancel();
    {
      py::gil_scoped_release release;
      future.wait();
    }
    std::uint64_t done = future.progress();
    try {
      done = future.get();  // every byte had moved by then
    } catch (const IoError& e) {
      done = e.bytes_done();
    } catch (const std::exception&) {
    }
    release_if_over();
    signal.value().attr("bytes_done") = done;
    std::string note = "ferry: the " + std::string(op == Op::kRead ? "read" : "write") +
                       " was cancelled with " + std::to_string(done) + " of " +
                       std::to_string(nbytes) + " bytes in place";
    if (py::hasattr(signal.value(), "add_note")) signal.value().attr("add_note")(note);
    throw signal;
  }

  // The result of a finished request; a strict-mode refusal carries its route report.
  std::size_t get() {
    wait(std::nullopt);
    try {
      return future.get();
    } catch (const RouteError& e) {
      throw RouteErrorWithReport(e, future.route());
    }
  }
};

// The request behind a ferry.Future.
class PyRequest {
 public:
  explicit PyRequest(std::shared_ptr<Pending> p) : p_(std::move(p)) {}

  std::size_t result() const { return p_->get(); }
  bool wait(std::optional<double> timeout) const { return p_->wait(timeout); }
  bool wait_quietly(double seconds) const {
    py::gil_scoped_release release;
    return p_->future.wait_for(seconds);
  }
  bool done() const { return p_->future.ready(); }
  bool cancel() const { return p_->future.cancel(); }
  void release() const { p_->release_if_over(); }
  std::uint64_t progress() const { return p_->future.progress(); }
  std::size_t nbytes() const { return p_->nbytes; }
  std::string op() const { return to_string(p_->op); }
  RouteReport route() const {
    p_->wait(std::nullopt);
    return p_->future.route();
  }

 private:
  std::shared_ptr<Pending> p_;
};

// What File.pread/pwrite return: the request, or for one that ended well in this thread (a
// small local one) (bytes moved, a handle that request_of() makes the request from):
// ferry.Future is then born finished, without a Request, a Condition or the watcher (4 KiB
// pread().result() cost 2.5x File.read's instructions that way, 7x before; bench/NOTES.md §30).
constexpr const char* kEnded = "ferry.ended_request";
py::object request_or_ended(std::shared_ptr<Pending> p, bool remote) {
  if (!remote && p->future.ready()) {
    std::size_t n;
    try {
      n = p->future.get();
    } catch (const std::exception&) {  // the Request holds the error, for the Future to raise
      return py::cast(PyRequest(std::move(p)));
    }
    py::capsule handle(new std::shared_ptr<Pending>(std::move(p)), kEnded, [](PyObject* h) {
      delete static_cast<std::shared_ptr<Pending>*>(PyCapsule_GetPointer(h, kEnded));
    });
    return py::make_tuple(n, std::move(handle));
  }
  return py::cast(PyRequest(std::move(p)));
}

std::size_t checked_size(const BufferView& view, const py::handle& size_arg) {
  std::size_t n = index_arg(size_arg, "size", true).value_or(view.nbytes());
  if (n > view.nbytes()) {
    throw py::value_error("ferry: size " + std::to_string(n) + " is larger than the buffer (" +
                          std::to_string(view.nbytes()) + " bytes)");
  }
  return n;
}

// Ranges for read_ranges: an (n, 3) array of integers (file offset, length, buffer offset), read
// straight from its buffer when it is one of 8-byte integers, or any sequence of 3-sequences.
std::vector<ByteRange> ranges_arg(const py::handle& ranges) {
  std::vector<ByteRange> out;
  auto bad = [](std::size_t i, const std::string& why) {
    return py::value_error("ferry: ranges[" + std::to_string(i) + "] " + why);
  };
  if (PyObject_CheckBuffer(ranges.ptr()) && !py::isinstance<py::bytes>(ranges)) {
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(ranges).request();
    const bool int64 = info.itemsize == 8 && (info.format == "q" || info.format == "Q" ||
                                              info.format == "l" || info.format == "L");
    if (info.ndim != 2 || info.shape[1] != 3 || !int64) {
      throw py::value_error(
          "ferry: ranges must be an (n, 3) array of 64-bit integers (file offset, length, buffer "
          "offset), or a sequence of 3-tuples");
    }
    const bool is_signed = info.format == "q" || info.format == "l";
    out.reserve(static_cast<std::size_t>(info.shape[0]));
    const char* base = static_cast<const char*>(info.ptr);
    for (py::ssize_t i = 0; i < info.shape[0]; ++i) {
      std::int64_t v[3];
      for (int k = 0; k < 3; ++k) {
        std::memcpy(&v[k], base + i * info.strides[0] + k * info.strides[1], 8);
        if (is_signed && v[k] < 0) throw bad(static_cast<std::size_t>(i), "has a negative value");
      }
      out.push_back({static_cast<std::uint64_t>(v[0]), static_cast<std::size_t>(v[1]),
                     static_cast<std::size_t>(v[2])});
    }
    return out;
  }
  std::size_t i = 0;
  for (const py::handle& item : ranges) {
    py::sequence t = py::reinterpret_borrow<py::sequence>(item);
    if (!py::isinstance<py::sequence>(item) || py::len(t) != 3) {
      throw bad(i, "must be (file_offset, length, buffer_offset)");
    }
    std::uint64_t v[3];
    const char* names[3] = {"file_offset", "length", "buffer_offset"};
    for (int k = 0; k < 3; ++k) v[k] = *index_arg(t[k], names[k]);
    out.push_back({v[0], static_cast<std::size_t>(v[1]), static_cast<std::size_t>(v[2])});
    ++i;
  }
  return out;
}

const char* const kModes[] = {"r", "r+", "w", "w+", "a"};

// Opening a remote object waits on the network, for minutes where it retries: the open runs in
// a helper thread while this one waits in slices, GIL released, looking for signals between
// them. A signal whose handler raises (Ctrl-C) cancels the open (FileOptions::cancel: its GETs
// and retry waits end within about a second), waits for the helper, and raises.
File open_interruptibly(const std::string& name, const std::string& mode, FileOptions options) {
  struct Opening {
    std::atomic<bool> cancel{false};
    std::promise<File> opened;
  };
  auto state = std::make_shared<Opening>();
  options.cancel = &state->cancel;
  std::future<File> result = state->opened.get_future();
  std::thread([state, name, mode, options = std::move(options)]() mutable {
    try {
      state->opened.set_value(File(name, mode, std::move(options)));
    } catch (...) {
      state->opened.set_exception(std::current_exception());
    }
  }).detach();
  const auto slice = std::chrono::duration<double>(kSignalSlice);
  for (;;) {
    {
      py::gil_scoped_release release;
      if (result.wait_for(slice) == std::future_status::ready) break;
    }
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set signal;
      state->cancel.store(true);
      {
        py::gil_scoped_release release;
        result.wait();
      }
      throw signal;
    }
  }
  return result.get();
}

class PyFile {
 public:
  PyFile(const py::object& path, const std::string& mode, bool direct,
         const std::map<std::string, std::string>& settings) {
    if (std::find(std::begin(kModes), std::end(kModes), mode) == std::end(kModes)) {
      throw py::value_error("ferry.open: mode must be 'r', 'r+', 'w', 'w+' or 'a', not '" + mode +
                            "' (files are always binary: no 'b' or 't')");
    }
    std::string name = path_arg(path);
    mode_ = mode;
    FileOptions options = file_options_arg(settings, direct);
    remote_ = is_remote_url(name);
    if (remote_) {
      file_ = open_interruptibly(name, mode, std::move(options));
      return;
    }
    py::gil_scoped_release release;
    file_ = File(name, mode, std::move(options));
  }
  ~PyFile() { wait_all(); }

  std::shared_ptr<Pending> submit(Op op, const py::object& buf, const py::handle& size,
                                  const py::handle& offset_arg) {
    check_open();
    std::uint64_t offset = *index_arg(offset_arg, "file_offset");
    std::shared_ptr<BufferView> view = BufferView::of(buf, op == Op::kRead);
    const std::size_t n = checked_size(*view, size);
    return submit_view(op, std::move(view), n, offset);
  }

  std::shared_ptr<Pending> submit_view(Op op, std::shared_ptr<BufferView> view, std::size_t n,
                                       std::uint64_t offset) {
    IoFuture future = start(op, view->data(), n, offset);
    return keep(op, std::move(view), n, std::move(future));
  }

  // Starts a request, the GIL released while File::pread/pwrite runs. One that ended in this
  // thread (a small request) has nothing for close() to wait for and no buffer to keep.
  IoFuture start(Op op, void* data, std::size_t n, std::uint64_t offset) {
    IoFuture future;
    {
      py::gil_scoped_release release;
      future = op == Op::kRead ? file_.pread(data, n, offset) : file_.pwrite(data, n, offset);
    }
    if (future.ready()) any_done_ = true;
    return future;
  }

  // The Pending entry of a request that start() began: while it runs, it keeps the buffer and
  // the File keeps it, for close() to wait for.
  std::shared_ptr<Pending> keep(Op op, std::shared_ptr<BufferView> view, std::size_t n,
                                IoFuture future) {
    auto pending = std::make_shared<Pending>();
    pending->op = op;
    pending->nbytes = n;
    pending->future = std::move(future);
    if (pending->future.ready()) return pending;
    pending->buffer = std::move(view);
    forget_finished();
    pending_.push_back(pending);
    return pending;
  }

  // A stream-ordered request (File::read_async): the buffer is kept until the request completes;
  // the stream orders its use by the GPU.
  std::shared_ptr<Pending> submit_stream(Op op, const py::object& buf, std::uintptr_t stream,
                                         const py::handle& size, const py::handle& offset_arg) {
    check_open();
    const std::uint64_t offset = *index_arg(offset_arg, "file_offset");
    auto pending = std::make_shared<Pending>();
    pending->op = op;
    pending->buffer = BufferView::of(buf, op == Op::kRead);
    pending->nbytes = checked_size(*pending->buffer, size);
    {
      py::gil_scoped_release release;
      void* data = pending->buffer->data();
      void* s = reinterpret_cast<void*>(stream);
      pending->future = op == Op::kRead ? file_.read_async(data, pending->nbytes, offset, s)
                                        : file_.write_async(data, pending->nbytes, offset, s);
    }
    forget_finished();
    pending_.push_back(pending);
    return pending;
  }

  std::size_t run_ranges(Op op, const py::object& buf, const py::handle& ranges) {
    std::size_t n = submit_ranges(op, buf, ranges)->get();
    any_done_ = true;
    return n;
  }

  // A gathered read of many ranges into one buffer (File::pread_ranges), or a scattered write
  // of many ranges from one (File::pwrite_ranges).
  std::shared_ptr<Pending> submit_ranges(Op op, const py::object& buf,
                                         const py::handle& ranges_obj) {
    check_open();
    std::vector<ByteRange> ranges = ranges_arg(ranges_obj);
    auto pending = std::make_shared<Pending>();
    pending->op = op;
    pending->buffer = BufferView::of(buf, op == Op::kRead);
    for (const ByteRange& r : ranges) pending->nbytes += r.size;
    {
      py::gil_scoped_release release;
      void* data = pending->buffer->data();
      const std::size_t size = pending->buffer->nbytes();
      pending->future = op == Op::kRead ? file_.pread_ranges(data, size, ranges)
                                        : file_.pwrite_ranges(data, size, ranges);
    }
    forget_finished();
    pending_.push_back(pending);
    return pending;
  }

  // A synchronous request: an interruptible wait, then the buffer is let go at once. A small one
  // runs in this thread (it takes microseconds, so Ctrl-C waits for nothing), without a Pending
  // entry or a future: 4 KiB reads cost 2.0x os.preadv through the Pending path, 1.6x this way.
  std::size_t run(Op op, const py::object& buf, const py::handle& size, const py::handle& offset) {
    check_open();
    const std::uint64_t at = *index_arg(offset, "file_offset");
    BufferView view;  // what a large request's Pending keeps is a view of its own
    view.fill(buf, op == Op::kRead);
    const std::size_t n = checked_size(view, size);
    // A remote object's GETs can wait on the network whatever their size: an interruptible wait.
    if (n > kSmallSync || remote_) {
      std::size_t done = submit_view(op, BufferView::of(buf, op == Op::kRead), n, at)->get();
      any_done_ = true;
      return done;
    }
    // A request that the settings refuse keeps its future, whose report the RouteError carries.
    auto through_future = [&] {
      IoFuture future =
          op == Op::kRead ? file_.pread(view.data(), n, at) : file_.pwrite(view.data(), n, at);
      try {
        return future.get();
      } catch (const RouteError& e) {
        throw RouteErrorWithReport(e, future.route());
      }
    };
    std::size_t done;
    {
      py::gil_scoped_release release;  // reacquired before `view` lets go of the buffer
      if (op == Op::kRead) {
        // File::read makes no future (600 instructions of a 4 KiB read, bench/NOTES.md §30). A
        // refusal comes before any I/O, so the read is asked again for its report.
        try {
          done = file_.read(view.data(), n, at);
        } catch (const RouteError&) {
          done = through_future();
        }
      } else if (n > kSmallAsync && !may_refuse()) {
        done = file_.write(view.data(), n, at);
      } else {
        // A write is not asked twice: in append mode each asking reserves a range. Up to
        // 64 KiB it runs in this thread too (File::pwrite's small path).
        done = through_future();
      }
    }
    any_done_ = true;
    return done;
  }

  // Whether the settings can refuse a request before any I/O (RouteError): strict mode, or
  // compat_mode=off. A bad setting counts as yes, so that the request reports it.
  bool may_refuse() const {
    try {
      const Settings s = file_.effective_settings();
      return !cufile_required_by(s).empty();
    } catch (const Error&) {
      return true;
    }
  }

  // Appends from several threads get disjoint ranges (File::append reserves each one).
  std::size_t append(const py::object& buf, const py::handle& size) {
    check_open();
    std::shared_ptr<BufferView> view = BufferView::of(buf, false);
    std::size_t n = checked_size(*view, size);
    py::gil_scoped_release release;  // reacquired before `view` lets go of the buffer
    return file_.append(view->data(), n);
  }

  void close() {
    wait_all();
    file_.close();
  }
  void check_open() const {
    if (!file_.is_open()) {
      throw py::value_error("I/O operation on closed file (" + printable(file_.path()) + ")");
    }
  }
  // None before any request of this File has ended.
  std::optional<RouteReport> last_route() {
    if (!any_done_) {
      for (const auto& p : pending_) any_done_ = any_done_ || p->future.ready();
    }
    if (!any_done_) return std::nullopt;
    return file_.last_route();
  }
  File& file() { return file_; }
  bool remote() const { return remote_; }
  const std::string& mode() const { return mode_; }
  std::size_t in_flight() const {
    return std::count_if(pending_.begin(), pending_.end(),
                         [](const auto& p) { return p->future.valid() && !p->future.ready(); });
  }

 private:
  void wait_all() {
    // Taken out first: other threads may submit while this one waits without the GIL.
    std::vector<std::shared_ptr<Pending>> waiting;
    waiting.swap(pending_);
    {
      py::gil_scoped_release release;
      for (const auto& p : waiting) {
        if (p->future.valid()) p->future.wait();
      }
    }
    if (!waiting.empty()) any_done_ = true;
    for (const auto& p : waiting) p->release_if_over();
  }
  void forget_finished() {
    std::erase_if(pending_, [this](const auto& p) {
      bool over = !p->future.valid() || p->future.ready();
      if (over) {
        any_done_ = true;
        p->release_if_over();
      }
      return over;
    });
  }

  File file_;
  std::string mode_;
  bool remote_ = false;
  bool any_done_ = false;
  std::vector<std::shared_ptr<Pending>> pending_;  // guarded by the GIL
};

// ferry.File's four byte-moving calls (read, write, pread, pwrite) are vectorcall methods of the
// class, made here, not pybind11 functions: pybind11's dispatcher (an argument tuple, two type
// lookups to find `self`, a function_call record) cost 1,900 of the 6,900 instructions of a
// 4 KiB File.read from Python, more than the C++ request itself (bench/NOTES.md §35). Arguments
// are parsed as pybind11 would (buf, size=None, file_offset=0, positional or by keyword), and a
// C++ exception still reaches Python through pybind11's translators.
thread_local std::exception_ptr t_escaped;

// Sets the Python error for the exception being handled, through pybind11's translators (the
// same ones a pybind11 function would use): it is rethrown inside a pybind11 function call.
PyObject* raise_translated() {
  t_escaped = std::current_exception();
  static PyObject* rethrow =
      py::cpp_function([] { std::rethrow_exception(std::exchange(t_escaped, nullptr)); })
          .release()
          .ptr();  // kept for the process's life, as pybind11 keeps its own functions
  Py_XDECREF(PyObject_CallNoArgs(rethrow));
  return nullptr;
}

// The File behind `self`, or null (TypeError set) when its __init__ never completed. The method
// descriptor has already checked that `self` is a _ferry.File (or subclass) instance, whose
// C++ value is its first and only one.
PyFile* file_of(PyObject* self) {
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  py::detail::value_and_holder vh = inst->get_value_and_holder(nullptr, false);
  if (!vh.holder_constructed()) {
    PyErr_SetString(PyExc_TypeError, "ferry.File: __init__ was not called");
    return nullptr;
  }
  return static_cast<PyFile*>(vh.value_ptr());
}

template <PyObject* (*Body)(PyFile&, const py::object&, const py::object&, const py::object&),
          const char* Name>
PyObject* fast_method(PyObject* self, PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  static constexpr const char* kNames[] = {"buf", "size", "file_offset"};
  static PyObject* const zero = PyLong_FromLong(0);
  PyObject* slots[3] = {nullptr, Py_None, zero};
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (n > 3) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most 3 arguments (%zd given)", Name, n);
    return nullptr;
  }
  std::copy(args, args + n, slots);
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    int at = 0;
    while (at < 3 && PyUnicode_CompareWithASCIIString(key, kNames[at]) != 0) ++at;
    if (at == 3) {
      PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", Name, key);
      return nullptr;
    }
    if (at < n) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", Name, kNames[at]);
      return nullptr;
    }
    slots[at] = args[n + k];
  }
  if (slots[0] == nullptr) {
    PyErr_Format(PyExc_TypeError, "%s() missing required argument 'buf' (pos 1)", Name);
    return nullptr;
  }
  PyFile* file = file_of(self);
  if (file == nullptr) return nullptr;
  try {
    return Body(*file, py::reinterpret_borrow<py::object>(slots[0]),
                py::reinterpret_borrow<py::object>(slots[1]),
                py::reinterpret_borrow<py::object>(slots[2]));
  } catch (...) {
    return raise_translated();
  }
}

PyObject* read_body(PyFile& f, const py::object& buf, const py::object& size,
                    const py::object& off) {
  return PyLong_FromSize_t(f.run(Op::kRead, buf, size, off));
}
PyObject* write_body(PyFile& f, const py::object& buf, const py::object& size,
                     const py::object& off) {
  return PyLong_FromSize_t(f.run(Op::kWrite, buf, size, off));
}
PyObject* pread_body(PyFile& f, const py::object& buf, const py::object& size,
                     const py::object& off) {
  return request_or_ended(f.submit(Op::kRead, buf, size, off), f.remote()).release().ptr();
}
PyObject* pwrite_body(PyFile& f, const py::object& buf, const py::object& size,
                      const py::object& off) {
  return request_or_ended(f.submit(Op::kWrite, buf, size, off), f.remote()).release().ptr();
}

constexpr char kReadName[] = "read";
constexpr char kWriteName[] = "write";
constexpr char kPreadName[] = "pread";
constexpr char kPwriteName[] = "pwrite";

// Docstrings in the form that gives inspect.signature its text signature.
PyMethodDef fast_methods[] = {
    {"read",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_method<read_body, kReadName>)),
     METH_FASTCALL | METH_KEYWORDS,
     "read($self, /, buf, size=None, file_offset=0)\n--\n\nReads into `buf` and returns the "
     "bytes read (fewer only at the end of the file). `size` is in bytes (default: the whole "
     "buffer); `file_offset` too."},
    {"write",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(fast_method<write_body, kWriteName>)),
     METH_FASTCALL | METH_KEYWORDS,
     "write($self, /, buf, size=None, file_offset=0)\n--\n\nWrites all of `buf` (or `size` "
     "bytes) and returns the count. `size` is in bytes (default: the whole buffer); "
     "`file_offset` too."},
    {"pread",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(fast_method<pread_body, kPreadName>)),
     METH_FASTCALL | METH_KEYWORDS,
     "pread($self, /, buf, size=None, file_offset=0)\n--\n\nStarts a read: a Request, or "
     "(bytes, handle) for one that has already ended well."},
    {"pwrite",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(fast_method<pwrite_body, kPwriteName>)),
     METH_FASTCALL | METH_KEYWORDS,
     "pwrite($self, /, buf, size=None, file_offset=0)\n--\n\nStarts a write: a Request, or "
     "(bytes, handle) for one that has already ended well."},
};

void add_methods(py::handle cls, PyMethodDef* begin, PyMethodDef* end) {
  for (PyMethodDef* def = begin; def != end; ++def) {
    PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), def);
    if (descr == nullptr) throw py::error_already_set();
    cls.attr(def->ml_name) = py::reinterpret_steal<py::object>(descr);
  }
}

// ferry.File.pread/pwrite and ferry.Future.result, made here rather than in Python: for a 4 KiB
// read that ended in the caller's thread, File.pread's frame, Future.__init__'s and result()'s
// cost 5,200 of the 8,500 instructions of `f.pread(buf).result()` (bench/NOTES.md §48). The
// Future is then made as Future.__init__ makes one born finished (python/ferry/_future.py), with
// the same four slots; every other request goes to Future(request) as before.
struct FutureClass {
  PyTypeObject* cls = nullptr;   // ferry.Future, set once by add_future_methods
  PyObject* finished = nullptr;  // concurrent.futures' FINISHED
  PyObject* result_slow = nullptr;
  PyObject* timeout = nullptr;  // interned, as the compiler interns a call's keyword names
  // Offsets of ferry.Future's slots (its __slots__), the state a finished Future's result()
  // reads. concurrent.futures.Future's code reaches them by name through their descriptors.
  Py_ssize_t state = 0, result = 0, exception = 0, ended = 0;
};
FutureClass future_class;

// A new reference to `o` (Py_NewRef, which Python 3.9 lacks).
PyObject* new_ref(PyObject* o) {
  Py_INCREF(o);
  return o;
}

PyObject*& slot(PyObject* object, Py_ssize_t offset) {
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(object) + offset);
}

// A finished ferry.Future holding `n` bytes moved and `handle` (an EndedRequest), or null with
// the Python error set. Its slots start empty (tp_alloc zeroes them). tp_alloc, not tp_new:
// object.__new__ would also lay out the instance dict's inline values (an allocation), which
// this Future never uses, its state being in slots; an instance without them is the state
// CPython leaves one in once its __dict__ was asked for, and an attribute set later (_request,
// _condition's lock) makes the dict. 136 instructions a call (bench/NOTES.md §48).
PyObject* finished_future(std::size_t n, py::object handle) {
  const FutureClass& c = future_class;
  PyObject* future = c.cls->tp_alloc(c.cls, 0);
  if (future == nullptr) return nullptr;
  PyObject* bytes = PyLong_FromSize_t(n);
  if (bytes == nullptr) {
    Py_DECREF(future);
    return nullptr;
  }
  slot(future, c.result) = bytes;
  slot(future, c.ended) = handle.release().ptr();
  slot(future, c.state) = new_ref(c.finished);
  slot(future, c.exception) = new_ref(Py_None);
  return future;
}

// The handle of a ferry.Future that future_of made finished: the request's IoFuture, made into
// a Request's Pending only when asked (request_of: nbytes, progress, last_route). One Python
// object, where request_or_ended's handle is a Pending, a shared_ptr and a capsule.
struct EndedRequest {
  PyObject ob_base;  // PyObject_HEAD
  IoFuture future;
  std::shared_ptr<Pending> pending;  // made by request_of, from `future`
  std::size_t nbytes;
  Op op;
};
PyTypeObject* ended_type = nullptr;

// Handles freed, kept for the next ones (the GIL guards them), as CPython keeps its floats: one
// from Python's allocator cost 150 instructions to make and 130 to free, a third of what the
// finished Future cost in C (bench/NOTES.md §48).
constexpr int kSpareHandles = 16;
EndedRequest* spare_handles[kSpareHandles];
int spare_handle_count = 0;

void ended_dealloc(PyObject* self) {
  auto* e = reinterpret_cast<EndedRequest*>(self);
  PyTypeObject* type = Py_TYPE(self);
  e->future.~IoFuture();
  e->pending.~shared_ptr();
  if (spare_handle_count < kSpareHandles) {
    spare_handles[spare_handle_count++] = e;
  } else {
    type->tp_free(self);
  }
  Py_DECREF(type);
}

PyType_Slot ended_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(ended_dealloc)},
    {Py_tp_doc, const_cast<char*>("A finished ferry.Future's request (request_of makes it).")},
    {0, nullptr},
};
PyType_Spec ended_spec = {"ferry._ferry.EndedRequest", sizeof(EndedRequest), 0, Py_TPFLAGS_DEFAULT,
                          ended_slots};

PyObject* new_ended(IoFuture future, std::size_t nbytes, Op op) {
  PyObject* self;
  if (spare_handle_count > 0) {
    self = PyObject_Init(&spare_handles[--spare_handle_count]->ob_base, ended_type);
  } else {
    self = ended_type->tp_alloc(ended_type, 0);
    if (self == nullptr) return nullptr;
  }
  auto* e = reinterpret_cast<EndedRequest*>(self);
  new (&e->future) IoFuture(std::move(future));
  new (&e->pending) std::shared_ptr<Pending>();
  e->nbytes = nbytes;
  e->op = op;
  return self;
}

// The Pending behind a handle of either kind (an EndedRequest, or request_or_ended's capsule).
std::shared_ptr<Pending> pending_of(const py::handle& handle) {
  if (Py_IS_TYPE(handle.ptr(), ended_type)) {
    auto* e = reinterpret_cast<EndedRequest*>(handle.ptr());
    if (!e->pending) {
      e->pending = std::make_shared<Pending>();
      e->pending->op = e->op;
      e->pending->nbytes = e->nbytes;
      e->pending->future = std::move(e->future);
    }
    return e->pending;
  }
  void* p = PyCapsule_GetPointer(handle.ptr(), kEnded);
  if (p == nullptr) throw py::error_already_set();
  return *static_cast<std::shared_ptr<Pending>*>(p);
}

// ferry.File.pread/pwrite: a ferry.Future, made here finished for a request that ended well in
// this thread, else Future(request) as before. The arguments are checked in submit()'s order.
PyObject* future_of(PyFile& f, Op op, const py::object& buf, const py::object& size,
                    const py::object& off) {
  f.check_open();
  const std::uint64_t offset = *index_arg(off, "file_offset");
  BufferView view;  // a request that ends in this thread needs no shared one
  view.fill(buf, op == Op::kRead);
  const std::size_t n = checked_size(view, size);
  IoFuture future = f.start(op, view.data(), n, offset);
  if (!f.remote() && future.ready()) {
    std::size_t bytes = 0;
    bool ended_well = false;
    try {
      bytes = future.get();
      ended_well = true;
    } catch (const std::exception&) {  // the Request holds the error, for the Future to raise
    }
    if (ended_well) {
      PyObject* handle = new_ended(std::move(future), n, op);
      if (handle == nullptr) return nullptr;
      return finished_future(bytes, py::reinterpret_steal<py::object>(handle));
    }
  }
  // A request still running keeps the buffer through a view of its own, taken while this one
  // still holds the memory in place (an exporter cannot move or free it while either is held).
  std::shared_ptr<BufferView> kept;
  if (!future.ready()) kept = BufferView::of(buf, op == Op::kRead);
  py::object request =
      request_or_ended(f.keep(op, std::move(kept), n, std::move(future)), f.remote());
  return PyObject_CallOneArg(reinterpret_cast<PyObject*>(future_class.cls), request.ptr());
}

PyObject* pread_future_body(PyFile& f, const py::object& buf, const py::object& size,
                            const py::object& off) {
  return future_of(f, Op::kRead, buf, size, off);
}
PyObject* pwrite_future_body(PyFile& f, const py::object& buf, const py::object& size,
                             const py::object& off) {
  return future_of(f, Op::kWrite, buf, size, off);
}

// ferry.Future.result: a Future finished well returns its bytes here; any other (waiting, an
// error, a timeout, Ctrl-C) goes to the Python method _result_slow, a subclass's if it has one.
PyObject* future_result(PyObject* self, PyObject* const* args, Py_ssize_t nargsf,
                        PyObject* kwnames) {
  const FutureClass& c = future_class;
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  const bool timeout_only = n + nkw == 0 || (n == 1 && nkw == 0) ||
                            (n == 0 && nkw == 1 && PyTuple_GET_ITEM(kwnames, 0) == c.timeout);
  if (timeout_only && slot(self, c.state) == c.finished && slot(self, c.exception) == Py_None) {
    PyObject* bytes = slot(self, c.result);
    if (bytes != nullptr && PyLong_CheckExact(bytes)) return new_ref(bytes);
  }
  // Python's own errors for wrong arguments, under the method's name: Future.result's.
  PyObject* few[3];
  std::vector<PyObject*> many;
  PyObject** call = few;
  if (n + nkw + 1 > 3) {
    many.resize(static_cast<std::size_t>(n + nkw + 1));
    call = many.data();
  }
  call[0] = self;
  std::copy(args, args + n + nkw, call + 1);
  return PyObject_VectorcallMethod(c.result_slow, call, static_cast<std::size_t>(n + 1), kwnames);
}

constexpr char kFuturePreadName[] = "pread";
constexpr char kFuturePwriteName[] = "pwrite";

PyMethodDef file_future_methods[] = {
    {"pread",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(fast_method<pread_future_body, kFuturePreadName>)),
     METH_FASTCALL | METH_KEYWORDS,
     "pread($self, /, buf, size=None, file_offset=0)\n--\n\nStarts reading `size` bytes "
     "(default: the whole buffer) at `file_offset` into `buf`; the Future's result is the bytes "
     "read. The buffer is kept alive until the read ends."},
    {"pwrite",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(fast_method<pwrite_future_body, kFuturePwriteName>)),
     METH_FASTCALL | METH_KEYWORDS,
     "pwrite($self, /, buf, size=None, file_offset=0)\n--\n\nStarts writing `buf` (or its "
     "first `size` bytes) at `file_offset`; the Future's result is the bytes written. The buffer "
     "is kept alive until the write ends."},
};

PyMethodDef future_methods[] = {
    {"result", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(future_result)),
     METH_FASTCALL | METH_KEYWORDS,
     "result($self, /, timeout=None)\n--\n\nWaits (``TimeoutError`` after `timeout` s) and "
     "returns the bytes moved, or raises the request's error. Ctrl-C cancels the request and "
     "raises KeyboardInterrupt with ``bytes_done`` (bytes in place)."},
};

// The offset of `cls`'s slot `name` (one of its __slots__: an object member).
Py_ssize_t slot_offset(const py::object& cls, const char* name) {
  py::object d = cls.attr(name);
  if (!Py_IS_TYPE(d.ptr(), &PyMemberDescr_Type)) {
    throw py::type_error(std::string("ferry: Future.") + name + " is not a slot");
  }
  const PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(d.ptr())->d_member;
  if (member->type != T_OBJECT_EX) {
    throw py::type_error(std::string("ferry: Future.") + name + " is not an object slot");
  }
  return member->offset;
}

// Called once by python/ferry/_file.py: File.pread/pwrite of the Python class `file` return
// `future` instances, and `future`.result is future_result.
void add_future_methods(const py::object& file, const py::object& future) {
  FutureClass& c = future_class;
  if (c.cls != nullptr) throw py::value_error("ferry: the Future class is already set");
  c.state = slot_offset(future, "_state");
  c.result = slot_offset(future, "_result");
  c.exception = slot_offset(future, "_exception");
  c.ended = slot_offset(future, "_ended");
  c.finished =
      py::object(py::module_::import("concurrent.futures._base").attr("FINISHED")).release().ptr();
  c.result_slow = PyUnicode_InternFromString("_result_slow");
  c.timeout = PyUnicode_InternFromString("timeout");
  // Kept for the process's life, as pybind11 keeps its own functions.
  c.cls = reinterpret_cast<PyTypeObject*>(py::object(future).release().ptr());
  ended_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&ended_spec));
  if (ended_type == nullptr) throw py::error_already_set();
  ended_type->tp_new = nullptr;  // made by new_ended only (Py_TPFLAGS_DISALLOW_INSTANTIATION)
  add_methods(future, std::begin(future_methods), std::end(future_methods));
  add_methods(file, std::begin(file_future_methods), std::end(file_future_methods));
}

}  // namespace

void bind_file(py::module_& m) {
  using py::arg;
  py::class_<PyRequest>(m, "Request",
                        "The request behind a ferry.Future: it owns the buffer until it ends.")
      .def("result", &PyRequest::result,
           "Waits (Ctrl-C cancels the request) and returns the bytes moved, or raises the "
           "request's error.")
      .def("wait", &PyRequest::wait, arg("timeout") = py::none(),
           "Waits up to `timeout` s (forever when None); Ctrl-C cancels the request. True when "
           "it has ended.")
      .def("wait_quietly", &PyRequest::wait_quietly, arg("seconds"),
           "Waits up to `seconds` with the GIL released, without looking at signals.")
      .def("done", &PyRequest::done)
      .def("cancel", &PyRequest::cancel,
           "Stops tasks not yet started; False when the request had already ended.")
      .def("release", &PyRequest::release, "Lets go of the buffer if the request has ended.")
      .def("progress", &PyRequest::progress, "Bytes moved so far by finished tasks.")
      .def_property_readonly("nbytes", &PyRequest::nbytes, "Bytes asked for.")
      .def_property_readonly("op", &PyRequest::op, "\"read\" or \"write\".")
      .def_property_readonly("last_route", &PyRequest::route, "The route report (waits).");

  auto none = py::none();
  py::class_<PyFile>(m, "File", "The C++ core of ferry.File.")
      .def(py::init<const py::object&, const std::string&, bool,
                    const std::map<std::string, std::string>&>(),
           arg("path"), arg("mode") = "r", arg("direct") = false,
           arg("settings") = std::map<std::string, std::string>{})
      .def(
          "read_async",
          [](PyFile& f, const py::object& buf, std::uintptr_t stream, const py::object& size,
             const py::object& off) {
            return PyRequest(f.submit_stream(Op::kRead, buf, stream, size, off));
          },
          arg("buf"), arg("stream"), arg("size") = none, arg("file_offset") = 0,
          "Stream-ordered read into `buf` on the CUstream `stream` (an int; 0 is the legacy "
          "default stream): after the work queued on it before, before the work queued after, "
          "without blocking or synchronising. The Future completes with the bytes read.")
      .def(
          "write_async",
          [](PyFile& f, const py::object& buf, std::uintptr_t stream, const py::object& size,
             const py::object& off) {
            return PyRequest(f.submit_stream(Op::kWrite, buf, stream, size, off));
          },
          arg("buf"), arg("stream"), arg("size") = none, arg("file_offset") = 0,
          "Stream-ordered write of `buf` on the CUstream `stream`; see read_async.")
      .def(
          "read_ranges",
          [](PyFile& f, const py::object& buf, const py::object& ranges) {
            return f.run_ranges(Op::kRead, buf, ranges);
          },
          arg("buf"), arg("ranges"),
          "Reads many ranges of the file into `buf` in one request and returns the bytes read. "
          "`ranges`: an (n, 3) integer array or a sequence of (file_offset, length, "
          "buffer_offset), all in bytes; ranges adjacent in the file and in the buffer are "
          "coalesced. A range outside the buffer or past the end of the file is an error before "
          "any I/O; last_route counts the ranges and runs.")
      .def(
          "pread_ranges",
          [](PyFile& f, const py::object& buf, const py::object& ranges) {
            return PyRequest(f.submit_ranges(Op::kRead, buf, ranges));
          },
          arg("buf"), arg("ranges"))
      .def(
          "write_ranges",
          [](PyFile& f, const py::object& buf, const py::object& ranges) {
            return f.run_ranges(Op::kWrite, buf, ranges);
          },
          arg("buf"), arg("ranges"),
          "Writes many ranges of `buf` to the file in one request and returns the bytes "
          "written. `ranges`: as for read_ranges, (file_offset, length, buffer_offset); ranges "
          "adjacent in the file and in the buffer are coalesced. A range outside the buffer, "
          "ranges that overlap in the file, or a file opened in append mode are errors before "
          "any I/O.")
      .def(
          "pwrite_ranges",
          [](PyFile& f, const py::object& buf, const py::object& ranges) {
            return PyRequest(f.submit_ranges(Op::kWrite, buf, ranges));
          },
          arg("buf"), arg("ranges"))
      .def(
          "append",
          [](PyFile& f, const py::object& buf, const py::object& size) {
            return f.append(buf, size);
          },
          arg("buf"), arg("size") = none,
          "Writes `buf` (or its first `size` bytes) at the end of the file.")
      .def(
          "sync",
          [](PyFile& f) {
            f.check_open();
            py::gil_scoped_release release;
            f.file().sync();
          },
          "fsync: what was written is on stable storage when it returns.")
      .def("close", &PyFile::close,
           "Waits for the file's requests, then closes it; closing twice is harmless.")
      .def_property_readonly(
          "size",
          [](PyFile& f) {
            f.check_open();
            return f.file().size();
          },
          "The file's size in bytes.")
      .def_property_readonly(
          "closed", [](PyFile& f) { return !f.file().is_open(); }, "True after close().")
      .def_property_readonly(
          "path", [](PyFile& f) { return path_str(f.file().path()); },
          "The path it was opened with (str, undecodable bytes as os.fsdecode gives them).")
      .def_property_readonly(
          "mode", [](PyFile& f) { return f.mode(); }, "The mode it was opened with.")
      .def_property_readonly("in_flight", &PyFile::in_flight,
                             "Asynchronous requests not ended yet.")
      .def_property_readonly("last_route", &PyFile::last_route,
                             "The route of the file's last ended request; None before any.")
      .def_property_readonly(
          "settings",
          [](PyFile& f) {
            f.check_open();
            return settings_dict(f.file().effective_settings());
          },
          "The file's effective settings.");
  add_methods(m.attr("File"), std::begin(fast_methods), std::end(fast_methods));
  m.def("add_future_methods", &add_future_methods, arg("file"), arg("future"),
        "Makes File.pread/pwrite of `file` return `future` instances, and `future`.result a "
        "C method (python/ferry/_file.py calls it once).");

  m.def(
      "request_of", [](const py::handle& handle) { return PyRequest(pending_of(handle)); },
      arg("handle"), "The Request of an ended File.pread/pwrite's (bytes, handle).");
  m.def(
      "buffer_info",
      [](const py::object& obj, bool writable) {
        auto view = BufferView::of(obj, writable);
        return py::make_tuple(reinterpret_cast<std::uintptr_t>(view->data()), view->nbytes(),
                              view->exporter());
      },
      arg("obj"), arg("writable") = false,
      "(address, nbytes, exporter) of the memory ferry would use for `obj`.");
}

}  // namespace ferry::python
