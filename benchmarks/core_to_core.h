// How far apart the first two CPUs are right now: the one-way latency of a cache line passed
// between two threads pinned to CPU 0 and CPU 1. On a virtual machine the host may place the two
// vCPUs on one core complex (tens of ns) or on two (hundreds), and move them every few seconds;
// every shared-memory figure changes with it (docs/performance.md), so the benchmarks print it
// beside each row. Returns -1 with fewer than two CPUs.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace smddp::bench {

inline double core_to_core_ns(int round_trips = 20000) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return -1;
  int cpus[2], n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
  alignas(64) std::atomic<int> flag{0};
  auto pin = [](int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
  };
  double ns = 0;
  std::thread echo([&] {
    pin(cpus[1]);
    for (int i = 0; i < round_trips; ++i) {
      while (flag.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      flag.store(2 * i + 2, std::memory_order_release);
    }
  });
  std::thread ping([&] {
    pin(cpus[0]);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < round_trips; ++i) {
      flag.store(2 * i + 1, std::memory_order_release);
      while (flag.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / round_trips / 2;
  });
  ping.join();
  echo.join();
  return ns;
}

}  // namespace smddp::bench
