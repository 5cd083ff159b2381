#include "remote/transfer_watch.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <thread>

#include "io/io_seam.h"

namespace ferry::remote {

#if FERRY_HAVE_CURL
namespace {

curl_socket_t on_open_socket(void* set, curlsocktype, curl_sockaddr* address) {
  auto& s = *static_cast<SocketSet*>(set);
  const curl_socket_t fd =
      ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
  if (fd == CURL_SOCKET_BAD) return fd;
  std::lock_guard lock(s.mu);
  s.open.push_back(fd);
  return fd;
}

int on_close_socket(void* set, curl_socket_t fd) {
  auto& s = *static_cast<SocketSet*>(set);
  std::lock_guard lock(s.mu);
  std::erase(s.open, fd);
  return ::close(fd);
}

// One per process: a child made by fork() makes its own, as its parent's thread is not there.
class Watcher {
 public:
  static Watcher& get() {
    static std::atomic<Watcher*> current{nullptr};  // process-wide: one watcher thread each
    Watcher* w = current.load();
    if (w != nullptr && w->pid_ == ::getpid()) return *w;
    auto* fresh = new Watcher;  // never destroyed, as its thread never ends
    if (current.compare_exchange_strong(w, fresh)) return *fresh;
    delete fresh;
    return *w;
  }
  void add(Watched* t) {
    std::lock_guard lock(mu_);
    if (!started_) {
      std::thread(&Watcher::run, this).detach();
      started_ = true;
    }
    watched_.push_back(t);
    wake_.notify_one();
  }
  void remove(Watched* t) {
    std::lock_guard lock(mu_);
    std::erase(watched_, t);
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [this] { return !watched_.empty(); });
      for (Watched* t : watched_) {
        if (t->shut || !t->flag()->load(std::memory_order_relaxed)) continue;
        std::lock_guard sockets(t->set()->mu);
        for (curl_socket_t fd : t->set()->open) ::shutdown(fd, SHUT_RDWR);
        t->shut = true;
      }
      wake_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  pid_t pid_ = ::getpid();
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Watched*> watched_;  // under mu_
  bool started_ = false;           // under mu_
};

}  // namespace

std::unique_ptr<SocketSet> SocketSet::after_fork(std::unique_ptr<SocketSet> parent) {
  (void)parent.release();
  return std::make_unique<SocketSet>();
}

void track_sockets(const CurlApi& api, CURL* handle, SocketSet* set) {
  api.easy_setopt(handle, CURLOPT_OPENSOCKETFUNCTION, &on_open_socket);
  api.easy_setopt(handle, CURLOPT_OPENSOCKETDATA, set);
  api.easy_setopt(handle, CURLOPT_CLOSESOCKETFUNCTION, &on_close_socket);
  api.easy_setopt(handle, CURLOPT_CLOSESOCKETDATA, set);
}

Watched::Watched(SocketSet* set) : flag_(io::cancel_flag()), set_(set) {
  if (flag_ != nullptr) Watcher::get().add(this);
}

Watched::~Watched() {
  if (flag_ != nullptr) Watcher::get().remove(this);
}
#endif

}  // namespace ferry::remote
