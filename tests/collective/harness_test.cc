// The harness's own checks: what run_ranks reports as a leak must be one, and must be reported
// (every collective test relies on them for "nothing leaks").
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "collective/harness.h"

namespace smddp::testing {
namespace {

using namespace std::chrono_literals;

// A thread still running when the rank's body returns is a leak.
TEST(Harness, AThreadLeftRunningIsALeak) {
  auto res = run_ranks(1, [](int, int, std::shared_ptr<Store>, Report&) {
    std::thread([] { std::this_thread::sleep_for(30s); }).detach();
  });
  EXPECT_FALSE(res.ok());
  EXPECT_NE(res.summary().find("thread leak"), std::string::npos) << res.summary();
}

// Threads joined just before the body returns are not: the kernel may list a joined thread in
// /proc/self/task for a moment after join() returns (it wakes the joiner before it reaps the task).
TEST(Harness, AThreadJustJoinedIsNoLeak) {
  auto res = run_ranks(1, [](int, int, std::shared_ptr<Store>, Report&) {
    // Each runs a moment, so that join() is waiting when it exits (the window above).
    for (int i = 0; i < 200; ++i)
      std::thread([] {
        volatile int x = 0;
        for (int k = 0; k < 20000; ++k) x = x + k;
      }).join();
  });
  EXPECT_TRUE(res.ok()) << res.summary();
}

TEST(Harness, ADescriptorLeftOpenIsALeak) {
  auto res = run_ranks(1, [](int, int, std::shared_ptr<Store>, Report&) {
    if (open("/dev/null", O_RDONLY | O_CLOEXEC) < 0) ADD_FAILURE() << "open /dev/null";
  });
  EXPECT_FALSE(res.ok());
  EXPECT_NE(res.summary().find("fd leak"), std::string::npos) << res.summary();
}

// Heap memory nothing points to when the rank's body returns is a leak, where LeakSanitizer runs
// (the sanitize step; ranks end in _exit, which skips its check at exit).
TEST(Harness, HeapMemoryLeftUnreachableIsALeak) {
#if defined(__SANITIZE_ADDRESS__)
  auto res = run_ranks(1, [](int, int, std::shared_ptr<Store>, Report&) {
    auto* lost = new std::vector<int>(1000, 7);
    const uintptr_t hidden = reinterpret_cast<uintptr_t>(lost) ^ 0x5a5a5a5a;  // no pointer to it stays
    if (hidden == 0) ADD_FAILURE();
    lost = nullptr;
  });
  EXPECT_FALSE(res.ok());
  EXPECT_NE(res.summary().find("LeakSanitizer found leaks in rank 0"), std::string::npos) << res.summary();
#else
  GTEST_SKIP() << "LeakSanitizer runs in the sanitize step's build (-fsanitize=address) only";
#endif
}

}  // namespace
}  // namespace smddp::testing
