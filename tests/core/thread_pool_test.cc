#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <set>
#include <thread>
#include <vector>

namespace ferry::core {
namespace {

TEST(ThreadPool, RunsEveryJobOnceUnderConcurrentSubmitters) {
  ThreadPool pool(4);
  std::atomic<int> sum{0};
  std::vector<std::promise<void>> done(8 * 1000);
  std::vector<std::thread> submitters;
  for (int s = 0; s < 8; ++s) {
    submitters.emplace_back([&, s] {
      for (int i = 0; i < 1000; ++i) {
        pool.submit([&, s, i] {
          sum.fetch_add(1);
          done[s * 1000 + i].set_value();
        });
      }
    });
  }
  for (auto& t : submitters) t.join();
  for (auto& p : done) p.get_future().wait();
  EXPECT_EQ(sum.load(), 8000);
}

TEST(ThreadPool, EnsureThreadsOnlyGrows) {
  ThreadPool pool(2);
  pool.ensure_threads(5);
  EXPECT_EQ(pool.size(), 5u);
  pool.ensure_threads(3);
  EXPECT_EQ(pool.size(), 5u);
}

TEST(ThreadPool, RunsJobsInParallel) {
  ThreadPool pool(4);
  std::atomic<int> arrived{0};
  std::vector<std::promise<void>> done(4);
  for (int i = 0; i < 4; ++i) {
    pool.submit([&, i] {
      arrived.fetch_add(1);
      // Every job waits for all four: this only finishes if four threads run at once.
      while (arrived.load() < 4) std::this_thread::yield();
      done[i].set_value();
    });
  }
  for (auto& p : done) {
    ASSERT_EQ(p.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  }
}

TEST(ThreadPool, DestructorFinishesQueuedJobs) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(1);
    for (int i = 0; i < 100; ++i) pool.submit([&] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 100);
}

}  // namespace
}  // namespace ferry::core
