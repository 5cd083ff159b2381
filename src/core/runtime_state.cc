#include "core/runtime_state.h"

#include <new>
#include <utility>

#include "core/fork_registry.h"
#include "ferry/runtime.h"

namespace ferry::core {
namespace {
// Every runtime of the process, for the fork() child handler.
using Runtimes = ForkRegistry<RuntimeState, &RuntimeState::restart_in_child>;
}  // namespace

RuntimeState::RuntimeState(Environment env)
    : env_(std::move(env)),
      pool_(new ThreadPool(0)),
      ordered_pool_(new ThreadPool(0)),
      staging_(new io::StagingPool) {
  Runtimes::add(this);
}

RuntimeState::~RuntimeState() {
  {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [this] { return files_ == 0; });
  }
  Runtimes::remove(this);
  // Workers first: a job finishing its last steps may still give a stager back.
  delete pool_.load();
  delete ordered_pool_.load();
  delete staging_.load();
}

void RuntimeState::attach() {
  std::lock_guard lock(mu_);
  ++files_;
}

void RuntimeState::detach() {
  std::lock_guard lock(mu_);
  if (--files_ == 0) idle_.notify_all();
}

std::size_t RuntimeState::attached() const {
  std::lock_guard lock(mu_);
  return files_;
}

void RuntimeState::restart_in_child() {
  new (&mu_) std::mutex;
  new (&idle_) std::condition_variable;
  pool_.store(new ThreadPool(0));
  ordered_pool_.store(new ThreadPool(0));
  staging_.store(new io::StagingPool);
}

}  // namespace ferry::core

namespace ferry {

Runtime::Runtime(const core::Environment& env)
    : state_(std::make_unique<core::RuntimeState>(env)) {}
Runtime::~Runtime() = default;
core::RuntimeState& core::state_of(const Runtime& runtime) { return *runtime.state_; }
std::size_t Runtime::threads() const { return state_->pool().size(); }
std::size_t Runtime::idle_staging() const { return state_->staging().idle(); }
std::size_t Runtime::free_idle_staging() { return state_->staging().free_idle(); }
std::size_t Runtime::files() const { return state_->attached(); }

}  // namespace ferry
