// host_copy: every byte of [dst, dst + n) from src and none outside, for every loop, at every
// relative alignment and around each size where the code changes path (the memcpy cut-off, the
// vector head, the 128-byte body, the tail).
#include "device/host_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "smddp/errors.h"

namespace smddp::device {
namespace {

std::vector<std::string> kinds_here() {
  std::vector<std::string> k = {"auto", "libc"};
#if defined(__x86_64__)
  k.push_back("sse2");
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) k.push_back("avx2");
#endif
  return k;
}

TEST(HostCopy, EveryAlignmentAndSizeCopiesExactlyTheRange) {
  const std::vector<size_t> sizes = {0, 1, 31, 63, 64, 511, 512, 513, 600, 1000, 4096, 4097, 128 * 1024 + 77};
  constexpr size_t kGuard = 64;
  std::vector<uint8_t> src(256 * 1024), dst(256 * 1024);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (const std::string& kind : kinds_here())
    for (size_t n : sizes)
      for (size_t so = 0; so < 64; so += 7)
        for (size_t dof = 0; dof < 64; dof += 5) {
          std::fill(dst.begin(), dst.end(), 0xA5);
          host_copy_as(kind, dst.data() + kGuard + dof, src.data() + so, n);
          for (size_t i = 0; i < kGuard + dof; ++i)
            ASSERT_EQ(dst[i], 0xA5) << kind << " n=" << n << " wrote before dst (src+" << so << ", dst+" << dof << ")";
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(dst[kGuard + dof + i], src[so + i])
                << kind << " n=" << n << " byte " << i << " (src+" << so << ", dst+" << dof << ")";
          for (size_t i = kGuard + dof + n; i < kGuard + dof + n + kGuard; ++i)
            ASSERT_EQ(dst[i], 0xA5) << kind << " n=" << n << " wrote past the end (src+" << so << ", dst+" << dof << ")";
        }
}

TEST(HostCopy, AnUnknownKindIsAClearError) {
  std::vector<uint8_t> a(8), b(8);
  try {
    host_copy_as("fast", b.data(), a.data(), a.size());
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SMDDP_HOST_COPY='fast'"), std::string::npos) << e.what();
  }
}

TEST(HostCopy, TheDefaultIsAVectorLoopOnX86) {
#if defined(__x86_64__)
  if (std::getenv("SMDDP_HOST_COPY")) GTEST_SKIP() << "SMDDP_HOST_COPY is set";
  __builtin_cpu_init();
  EXPECT_STREQ(host_copy_kind(), __builtin_cpu_supports("avx2") ? "avx2" : "sse2");
#else
  GTEST_SKIP() << "not x86-64: memcpy everywhere";
#endif
}

}  // namespace
}  // namespace smddp::device
