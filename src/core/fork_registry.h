// The live objects of one type that a child made by fork() must repair: threads of the parent do
// not exist in the child, and locks they held stay held. Each object adds itself while alive; in
// the child, the registry's own lock is fresh and `repair` runs on every object, before any other
// code of the child. Thread-safe. The registry is leaked on purpose: objects may be removed by
// static destructors at exit.
#pragma once

#include <pthread.h>

#include <mutex>
#include <new>
#include <unordered_set>

namespace ferry::core {

template <typename T, void (T::*repair)()>
class ForkRegistry {
 public:
  static void add(T* object) {
    State& s = state();
    std::lock_guard lock(s.mu);
    s.objects.insert(object);
  }
  static void remove(T* object) {
    State& s = state();
    std::lock_guard lock(s.mu);
    s.objects.erase(object);
  }

 private:
  struct State {
    std::mutex mu;
    std::unordered_set<T*> objects;
  };
  static State& state() {
    static State* s = [] {
      instance = new State;
      pthread_atfork(nullptr, nullptr, [] {
        new (&instance->mu) std::mutex;
        for (T* object : instance->objects) (object->*repair)();
      });
      return instance;
    }();
    return *s;
  }
  static inline State* instance = nullptr;
};

}  // namespace ferry::core
