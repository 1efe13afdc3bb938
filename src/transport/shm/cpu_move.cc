#include "transport/shm/cpu_move.h"

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "smddp/errors.h"

// glibc 2.35 and later: the size of the rseq area it registers for every thread (0: none, as
// under GLIBC_TUNABLES=glibc.pthread.rseq=0 or a seccomp profile that refuses rseq). Weak, so
// that an older glibc, which lacks it, leaves its address null.
extern "C" __attribute__((weak)) const unsigned int __rseq_size;

namespace smddp::shm {

bool cpu_number_is_cheap() {
#if defined(__x86_64__) || defined(__i386__)
  constexpr bool vdso = true;  // the vDSO's getcpu (RDPID or LSL)
#else
  constexpr bool vdso = false;  // aarch64's vDSO has none
#endif
  return vdso || glibc_registered_rseq();
}

bool glibc_registered_rseq() { return &__rseq_size != nullptr && __rseq_size > 0; }

void restore_affinity(const cpu_set_t& allowed) {
  // Since Linux 6.2 the mask of any sched_setaffinity call is kept as the thread's own request,
  // which later changes of its cpuset are intersected with. Given back the list it had, a thread
  // that never asked for CPUs (its mask is its cpuset) would stop following its cpuset: a
  // container or job widened later would leave it on the old CPUs. So "any CPU" first, which the
  // kernel limits to the cpuset. A result within `allowed` is the cpuset (shrunk meanwhile, where
  // it is less): kept. One reaching outside it means the thread had asked for fewer CPUs: those
  // are set again. A thread that had asked for exactly its cpuset's CPUs follows the cpuset from
  // then on: the two cannot be told apart.
  cpu_set_t any;
  std::memset(&any, 0xff, sizeof any);
  const bool widened = ::sched_setaffinity(0, sizeof any, &any) == 0;
  cpu_set_t got, within;
  if (widened && ::sched_getaffinity(0, sizeof got, &got) == 0) {
    CPU_AND(&within, &got, &allowed);
    if (CPU_EQUAL(&within, &got)) return;
  }
  for (int attempt = 0; attempt < 2; ++attempt)  // once more before giving up: a narrowed thread would stay so
    if (::sched_setaffinity(0, sizeof allowed, &allowed) == 0) return;
  const int err = errno;
  // Widened to the cpuset, the thread may run wherever it could before, and more: not stuck.
  if (widened) return;
  throw SystemError("smddp: could not restore this thread's CPU affinity after moving it off a CPU its peer rank "
                    "shares: " + std::system_category().message(err));
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
  // Another thread (a job manager's `taskset -p`, the user's own pinning) may have set this
  // thread's affinity since it was read. A mask read back now with a CPU outside the one just set
  // is such a mask, and the one to keep rather than the stale `allowed`. (One within it may be a
  // cpuset that shrank meanwhile: restored as usual. A mask set before the narrowing is lost.)
  cpu_set_t now, either;
  if (::sched_getaffinity(0, sizeof now, &now) == 0) {
    CPU_OR(&either, &now, &others);
    if (!CPU_EQUAL(&either, &others)) return ::sched_getcpu() != here;
  }
  restore_affinity(allowed);
  return true;
}

}  // namespace smddp::shm
