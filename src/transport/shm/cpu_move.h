// Moving a waiting thread off a CPU its peer rank shares (shm::Group::wait): the affinity is
// narrowed to the other CPUs, which migrates the thread at once, and then restored.
#pragma once

#include <sched.h>

#include <vector>

namespace smddp::shm {

// Moves the calling thread to another CPU of its affinity at once, one not in `avoid` where there
// is such a CPU, and leaves the affinity as it was (narrowed to the others, then restored: the
// thread stays where it went). False where the affinity holds only the current CPU or cannot be
// read or set.
bool move_to_another_cpu(const std::vector<int>& avoid = {});

// The mask that restores `allowed`. On Linux 6.2 and later any sched_setaffinity call keeps its
// mask as the thread's own request, which a later change of the thread's cpuset is intersected
// with: a thread that never asked for CPUs (its mask is every CPU online) and were given back that
// list would stop following its cpuset (a container or job widened later would leave it on the
// old CPUs). So such a thread is given every CPU the mask can name, which the kernel limits to
// the cpuset as if the thread had never been touched; any other mask is restored as it was.
cpu_set_t affinity_to_restore(const cpu_set_t& allowed, const std::vector<int>& online);

// Whether sched_getcpu() is cheap enough to call every round: a few ns through x86's vDSO or
// where glibc (2.35 and later) reads it from its rseq area; elsewhere (aarch64 with an older glibc,
// or rseq turned off by GLIBC_TUNABLES) a system call, a sizeable part of a small collective.
bool cpu_number_is_cheap();
bool glibc_registered_rseq();  // this thread's rseq area, glibc's (2.35 and later)

// The CPUs online (/sys/devices/system/cpu/online), read once; empty where unreadable.
const std::vector<int>& online_cpus();

}  // namespace smddp::shm
