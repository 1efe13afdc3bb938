#include "core/fork_generation.h"

#include <pthread.h>

#include <atomic>

namespace smddp::detail {

namespace {
std::atomic<uint64_t> forks{0};
void in_child() { forks.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

uint64_t fork_generation() {
  static const bool registered = pthread_atfork(nullptr, nullptr, in_child) == 0;
  (void)registered;
  return forks.load(std::memory_order_relaxed);
}

}  // namespace smddp::detail
