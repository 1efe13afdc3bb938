#include "transport/shm/cpu_move.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "smddp/errors.h"
#include "topology/topology.h"

// glibc 2.35 and later: the size of the rseq area it registered for each thread (0: none). Weak,
// so that an older glibc, which lacks it, leaves its address null.
extern "C" __attribute__((weak)) const unsigned int __rseq_size;

namespace smddp::shm {

bool cpu_number_is_cheap() {
#if defined(__x86_64__) || defined(__i386__)
  constexpr bool vdso = true;  // the vDSO's getcpu (RDPID or RDTSCP)
#else
  constexpr bool vdso = false;  // aarch64's vDSO has none
#endif
  return vdso || glibc_registered_rseq();
}

bool glibc_registered_rseq() { return &__rseq_size != nullptr && __rseq_size > 0; }

const std::vector<int>& online_cpus() {
  static const std::vector<int> cpus = [] {
    std::ifstream in("/sys/devices/system/cpu/online");
    std::string text;
    std::getline(in, text);
    return topology::parse_cpu_ranges(text);
  }();
  return cpus;
}

cpu_set_t affinity_to_restore(const cpu_set_t& allowed, const std::vector<int>& online) {
  bool every_online = !online.empty();
  for (int c : online) every_online &= c < CPU_SETSIZE && CPU_ISSET(c, &allowed);
  if (!every_online || CPU_COUNT(&allowed) != static_cast<int>(online.size())) return allowed;
  cpu_set_t any;
  std::memset(&any, 0xff, sizeof any);
  return any;
}

bool move_to_another_cpu(const std::vector<int>& avoid) {
  // cpu_set_t holds 1024 CPUs; on a kernel with more, the calls fail and the waiter sleeps instead.
  const int here = ::sched_getcpu();
  cpu_set_t allowed;
  if (here < 0 || ::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  if (here >= CPU_SETSIZE || !CPU_ISSET(here, &allowed) || CPU_COUNT(&allowed) < 2) return false;
  cpu_set_t others = allowed;
  CPU_CLR(here, &others);
  cpu_set_t free_of_ranks = others;
  for (int c : avoid)
    if (c >= 0 && c < CPU_SETSIZE) CPU_CLR(c, &free_of_ranks);
  if (CPU_COUNT(&free_of_ranks) > 0) others = free_of_ranks;
  if (::sched_setaffinity(0, sizeof others, &others) != 0) return false;
  // Another thread (a job manager's `taskset -p`, the user's pinning code) may have set this
  // thread's affinity since it was read: then that mask is the one to keep, not the old one. Read
  // back, this closes all of the window but the microsecond between the two calls.
  cpu_set_t now;
  if (::sched_getaffinity(0, sizeof now, &now) == 0 && !CPU_EQUAL(&now, &others)) return true;
  // Restored at once. Should that fail the thread would stay narrowed: try again, then say so.
  const cpu_set_t restore = affinity_to_restore(allowed, online_cpus());
  if (::sched_setaffinity(0, sizeof restore, &restore) != 0 && ::sched_setaffinity(0, sizeof allowed, &allowed) != 0)
    throw SystemError(std::string("smddp: could not restore this thread's CPU affinity after moving it off a CPU "
                                  "its peer rank shares: ") + std::strerror(errno));
  return true;
}

}  // namespace smddp::shm
