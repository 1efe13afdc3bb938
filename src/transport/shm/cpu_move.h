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

// Sets the calling thread's affinity back to `allowed`, read before a move (cpu_move.cc says
// how a thread that never asked for CPUs keeps following its cpuset).
void restore_affinity(const cpu_set_t& allowed);

// Whether sched_getcpu() is cheap enough to call every round: a few ns through x86's vDSO or
// where glibc (2.35 and later) reads it from its rseq area; elsewhere (aarch64 with an older glibc,
// or rseq refused or turned off) a system call, a sizeable part of a small collective.
bool cpu_number_is_cheap();
bool glibc_registered_rseq();  // glibc's rseq area, registered for every thread (2.35 and later)

}  // namespace smddp::shm
