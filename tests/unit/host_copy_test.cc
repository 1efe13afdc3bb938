// host_copy: every byte of [dst, dst + n) from src and none outside, for every loop, at every
// relative alignment and around each size where the code changes path (the memcpy cut-off, the
// vector head, the 128-byte body, the tail).
#include "device/host_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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

// A page-aligned buffer, so that where a copy lands relative to its source's page offset is known.
struct PageBuffer {
  explicit PageBuffer(size_t bytes) : p(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes))), n(bytes) {}
  ~PageBuffer() { std::free(p); }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  uint8_t* begin() { return p; }
  uint8_t* end() { return p + n; }
  uint8_t* data() { return p; }
  uint8_t& operator[](size_t i) { return p[i]; }
  uint8_t* p;
  size_t n;
};

// Page-aligned buffers: the destination (kGuard + dof into its page) lies 64 + dof - so bytes
// past the source, so dof < so takes the loop and the rest memcpy; both are counted.
TEST(HostCopy, EveryAlignmentAndSizeCopiesExactlyTheRange) {
  const std::vector<size_t> sizes = {0, 1, 31, 63, 64, 511, 512, 513, 600, 1000, 4096, 4097, 128 * 1024 + 77};
  constexpr size_t kGuard = 64;
  PageBuffer src(256 * 1024), dst(256 * 1024);
  size_t looped = 0, plain = 0;
  // No period: an offset error of any size shows.
  uint32_t x = 12345;
  for (auto& b : src) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  for (const std::string& kind : kinds_here())
    for (size_t n : sizes)
      for (size_t so = 0; so < 64; so += 7)
        for (size_t dof = 0; dof < 64; dof += 5) {
          std::fill(dst.begin(), dst.end(), 0xA5);
          if (n >= 512) ++(host_copy_takes_loop(dst.data() + kGuard + dof, src.data() + so, n) ? looped : plain);
          host_copy_as(kind, dst.data() + kGuard + dof, src.data() + so, n);
          const uint8_t* out = dst.data() + kGuard + dof;
          if (std::memcmp(out, src.data() + so, n) == 0 && dst[kGuard + dof - 1] == 0xA5 && out[n] == 0xA5 &&
              std::all_of(dst.begin(), dst.begin() + static_cast<long>(kGuard + dof), [](uint8_t b) { return b == 0xA5; }) &&
              std::all_of(out + n, out + n + kGuard, [](uint8_t b) { return b == 0xA5; }))
            continue;  // the byte-by-byte checks below say where it went wrong
          for (size_t i = 0; i < kGuard + dof; ++i)
            ASSERT_EQ(dst[i], 0xA5) << kind << " n=" << n << " wrote before dst (src+" << so << ", dst+" << dof << ")";
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(dst[kGuard + dof + i], src[so + i])
                << kind << " n=" << n << " byte " << i << " (src+" << so << ", dst+" << dof << ")";
          for (size_t i = kGuard + dof + n; i < kGuard + dof + n + kGuard; ++i)
            ASSERT_EQ(dst[i], 0xA5) << kind << " n=" << n << " wrote past the end (src+" << so << ", dst+" << dof << ")";
        }
  EXPECT_GT(looped, 0u) << "no copy took the loop";
  EXPECT_GT(plain, 0u) << "no copy of 512 bytes or more took memcpy";
}

// The loop is taken exactly where memcpy would go slow: the destination 1-63 bytes past the
// source modulo a page, 512 bytes to 4 MiB. (The copy tests above pass whichever path runs; this
// holds the choice.)
TEST(HostCopy, TheLoopTakesCopiesJustAheadOfTheirSourceOnly) {
  auto* a = static_cast<uint8_t*>(std::aligned_alloc(4096, 3 * 4096));
  auto* b = static_cast<uint8_t*>(std::aligned_alloc(4096, 3 * 4096));
  EXPECT_TRUE(host_copy_takes_loop(b + 16, a, 4096));
  EXPECT_TRUE(host_copy_takes_loop(b + 1, a, 512));
  EXPECT_TRUE(host_copy_takes_loop(b + 63, a, 4096));
  EXPECT_TRUE(host_copy_takes_loop(b + 4096 + 16, a + 8192, 4096)) << "the page offset counts, not the address";
  EXPECT_TRUE(host_copy_takes_loop(b + 20, a + 4, (4u << 20) - 1));
  EXPECT_FALSE(host_copy_takes_loop(b, a, 4096)) << "same page offset";
  EXPECT_FALSE(host_copy_takes_loop(b + 64, a, 4096)) << "a line ahead";
  EXPECT_FALSE(host_copy_takes_loop(b, a + 16, 4096)) << "behind the source";
  EXPECT_FALSE(host_copy_takes_loop(b + 16, a, 511)) << "small";
  EXPECT_FALSE(host_copy_takes_loop(b + 16, a, 4u << 20)) << "large: glibc's own loop or streaming stores";
  std::free(a);
  std::free(b);
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

// auto measures memcpy 16 bytes ahead of its source once, and takes the best loop only where
// that is slow (AMD EPYC with glibc 2.36); where rep movsb copes (Intel), memcpy everywhere.
TEST(HostCopy, TheDefaultIsMemcpyOrTheBestLoopOnX86) {
#if defined(__x86_64__)
  if (std::getenv("SMDDP_HOST_COPY")) GTEST_SKIP() << "SMDDP_HOST_COPY is set";
  __builtin_cpu_init();
  const std::string kind = host_copy_kind();
  EXPECT_TRUE(kind == "libc" || kind == (__builtin_cpu_supports("avx2") ? "avx2" : "sse2")) << kind;
#else
  GTEST_SKIP() << "not x86-64: memcpy everywhere";
#endif
}

}  // namespace
}  // namespace smddp::device
