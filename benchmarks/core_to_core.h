// How far apart the first two CPUs are right now: the one-way latency of a cache line passed
// between two threads pinned to CPU 0 and CPU 1. On a virtual machine the host may place the two
// vCPUs on one core complex (tens of ns) or on two (hundreds), and move them every few seconds;
// every shared-memory figure changes with it (docs/performance.md), so the benchmarks print it
// beside each row. The round trips run in batches and the fastest batch counts: beside busy
// processes (the contention sweeps) a batch in which either thread lost its core reads a time
// slice, not the distance, and some batch runs whole. Returns -1 with fewer than two CPUs.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace smddp::bench {

inline double core_to_core_ns(int batches = 40, int trips_per_batch = 250) {
  const int round_trips = batches * trips_per_batch;
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
    double best = 0;
    for (int b = 0; b < batches; ++b) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = b * trips_per_batch; i < (b + 1) * trips_per_batch; ++i) {
        flag.store(2 * i + 1, std::memory_order_release);
        while (flag.load(std::memory_order_acquire) != 2 * i + 2) {
        }
      }
      const double one_way =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / trips_per_batch / 2;
      if (b == 0 || one_way < best) best = one_way;
    }
    ns = best;
  });
  ping.join();
  echo.join();
  return ns;
}

}  // namespace smddp::bench
