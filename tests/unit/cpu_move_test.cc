// shm::restore_affinity and shm::move_to_another_cpu (cpu_move.h): a thread moved off a CPU its
// peer shares gets its affinity back, whether it had every CPU of its cpuset (then given "any
// CPU", so that it keeps following the cpuset) or had asked for fewer (given those back); and how
// cheaply the rank can read its CPU number. Each case runs in a thread of its own, so that the
// test process's affinity stays as it was.
#include <gtest/gtest.h>

#if defined(__GLIBC__)
#if __GLIBC_PREREQ(2, 35)
#define SMDDP_GLIBC_HAS_RSEQ 1
#include <sys/rseq.h>
#endif
#endif

#include <exception>
#include <string>
#include <thread>

#include "transport/shm/cpu_move.h"

namespace smddp::shm {
namespace {

cpu_set_t own_affinity() {
  cpu_set_t s;
  CPU_ZERO(&s);
  EXPECT_EQ(sched_getaffinity(0, sizeof s, &s), 0);
  return s;
}

// Runs `body` in a new thread and returns what it reported ("" for nothing wrong), an exception's
// message included (one left to escape the thread would end the whole test binary).
template <class Body>
std::string in_thread(Body body) {
  std::string wrong;
  std::thread([&] {
    try {
      wrong = body();
    } catch (const std::exception& e) {
      wrong = e.what();
    }
  }).join();
  return wrong;
}

// A smoke test: that such a thread now follows its cpuset (the request the kernel keeps) cannot be
// read without privileges; what can be is that its mask is as it was.
TEST(CpuMove, AThreadWithItsWholeAffinityGetsItBack) {
  const cpu_set_t before = own_affinity();
  EXPECT_EQ(in_thread([&]() -> std::string {
              restore_affinity(before);
              const cpu_set_t after = own_affinity();
              return CPU_EQUAL(&after, &before) ? "" : "the affinity changed";
            }),
            "");
}

TEST(CpuMove, AThreadThatAskedForFewerCpusGetsThoseBack) {
  const cpu_set_t all = own_affinity();
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "needs 2 CPUs in this process's affinity";
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  EXPECT_EQ(in_thread([&]() -> std::string {
              cpu_set_t one;
              CPU_ZERO(&one);
              CPU_SET(first, &one);
              if (sched_setaffinity(0, sizeof one, &one) != 0) return "could not narrow the thread";
              restore_affinity(one);  // "any CPU" would widen it: the mask it had instead
              const cpu_set_t after = own_affinity();
              return CPU_EQUAL(&after, &one) ? "" : "restored " + std::to_string(CPU_COUNT(&after)) + " CPUs, not 1";
            }),
            "");
}

TEST(CpuMove, MovingANarrowedThreadKeepsItsMask) {
  const cpu_set_t all = own_affinity();
  if (CPU_COUNT(&all) < 3) GTEST_SKIP() << "needs 3 CPUs in this process's affinity (a mask of 2 within them)";
  EXPECT_EQ(in_thread([&]() -> std::string {
              cpu_set_t two;
              CPU_ZERO(&two);
              for (int c = 0, n = 0; c < CPU_SETSIZE && n < 2; ++c) {
                if (CPU_ISSET(c, &all)) {
                  CPU_SET(c, &two);
                  ++n;
                }
              }
              if (sched_setaffinity(0, sizeof two, &two) != 0) return "could not narrow the thread";
              if (!move_to_another_cpu()) return "the move failed";
              const cpu_set_t after = own_affinity();
              return CPU_EQUAL(&after, &two) ? "" : "the mask of 2 CPUs became " + std::to_string(CPU_COUNT(&after));
            }),
            "");
}

// Where glibc registered its rseq area the rank publishes its CPU every round; the weak lookup of
// __rseq_size must agree with glibc's own declaration of it.
TEST(CpuMove, GlibcsRseqAreaIsFoundAsGlibcSaysIt) {
#if defined(SMDDP_GLIBC_HAS_RSEQ)
  EXPECT_EQ(glibc_registered_rseq(), __rseq_size > 0);
  if (glibc_registered_rseq()) {
    EXPECT_TRUE(cpu_number_is_cheap());
  }
#else
  EXPECT_FALSE(glibc_registered_rseq());
#endif
}

}  // namespace
}  // namespace smddp::shm
