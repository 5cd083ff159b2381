#include <chrono>
#include <cstdio>

#include "core/stats_publish.h"
#include "core/stats_recorder.h"
int main() {
  using C = std::chrono::steady_clock;
  auto t0 = C::now();
  auto who = ferry::core::this_process();
  auto t1 = C::now();
  ferry::core::record_small_request(ferry::Op::kRead, 4096, 1000, ferry::ReasonCode::kHostBuffer,
                                    false);
  auto t2 = C::now();
  ferry::core::record_small_request(ferry::Op::kRead, 4096, 1000, ferry::ReasonCode::kHostBuffer,
                                    false);
  auto t3 = C::now();
  std::printf("this_process %.1f us, first record %.1f us, second %.3f us (pid %llu)\n",
              std::chrono::duration<double, std::micro>(t1 - t0).count(),
              std::chrono::duration<double, std::micro>(t2 - t1).count(),
              std::chrono::duration<double, std::micro>(t3 - t2).count(),
              (unsigned long long)who.pid);
}
