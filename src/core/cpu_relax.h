// The hint a spin-wait loop gives the CPU each poll: x86's `pause` (lets the sibling hyperthread
// run, and avoids the memory-order flush on leaving the loop), aarch64's `yield`.
#pragma once

namespace smddp {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace smddp
