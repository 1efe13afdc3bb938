// The hint a spin-wait loop gives the CPU each poll: x86's `pause` (lets the sibling hyperthread
// run, avoids the memory-order flush on leaving the loop, and takes tens of cycles), aarch64's
// `isb` (Neoverse cores treat `yield` as a no-op, so a loop of them would end its SMDDP_SPIN
// polls many times sooner than on x86; `isb` stalls each poll a few tens of cycles, as Rust's
// spin_loop and other runtimes do). Not measured on Arm hardware: the polls' length there is
// a guess until then.
#pragma once

namespace smddp {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("isb" ::: "memory");
#endif
}

}  // namespace smddp
