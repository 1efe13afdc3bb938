// shm::affinity_to_restore (cpu_move.h): what a thread moved off a shared CPU gets back. A mask of
// every CPU online (a thread that never asked for CPUs) comes back as "any CPU", so the thread
// keeps following its cpuset; any narrower or different mask comes back exactly.
#include <gtest/gtest.h>

#include <cstdlib>

#include "transport/shm/cpu_move.h"

namespace smddp::shm {
namespace {

cpu_set_t set_of(std::initializer_list<int> cpus) {
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int c : cpus) CPU_SET(c, &s);
  return s;
}

TEST(CpuMove, EveryOnlineCpuIsRestoredAsAnyCpu) {
  const cpu_set_t all = set_of({0, 1, 2, 3});
  const cpu_set_t r = affinity_to_restore(all, {0, 1, 2, 3});
  EXPECT_EQ(CPU_COUNT(&r), CPU_SETSIZE);
}

TEST(CpuMove, ANarrowerOrOtherMaskIsRestoredExactly) {
  for (const cpu_set_t& mine : {set_of({0, 2}), set_of({0, 1, 2, 3, 5}), set_of({1, 2, 3, 4})}) {
    const cpu_set_t r = affinity_to_restore(mine, {0, 1, 2, 3});
    EXPECT_TRUE(CPU_EQUAL(&r, &mine)) << CPU_COUNT(&mine);
  }
  // Online CPUs unknown: nothing to compare with, so the mask as it was.
  const cpu_set_t some = set_of({0, 1});
  const cpu_set_t r = affinity_to_restore(some, {});
  EXPECT_TRUE(CPU_EQUAL(&r, &some));
}

TEST(CpuMove, OnlineCpusAreReadFromTheKernel) {
  const std::vector<int>& online = online_cpus();
  ASSERT_FALSE(online.empty()) << "/sys/devices/system/cpu/online was unreadable";
  for (int c : online) EXPECT_GE(c, 0);
}

// Every rank publishes its CPU each round where reading it costs a few ns: where glibc registered
// its rseq area (2.35 and later, unless GLIBC_TUNABLES turns it off), as bookworm's 2.36,
// trixie's and forky's do, and on x86 in any case.
TEST(CpuMove, GlibcsRseqAreaIsFound) {
#if __GLIBC_PREREQ(2, 35)
  if (std::getenv("GLIBC_TUNABLES") != nullptr) GTEST_SKIP() << "GLIBC_TUNABLES may turn rseq off";
  EXPECT_TRUE(glibc_registered_rseq());
  EXPECT_TRUE(cpu_number_is_cheap());
#else
  EXPECT_FALSE(glibc_registered_rseq());
#endif
}

}  // namespace
}  // namespace smddp::shm
