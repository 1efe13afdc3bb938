// The host buffers of point-to-point operations on CUDA memory (core/p2p_staging.h): one per
// operation in flight, reused after, registered (the hooks) once per allocation, and a buffer
// above the keep size given back once none is out, so a one-off huge message does not stay
// page-locked.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <stdexcept>

#include "core/p2p_staging.h"

namespace smddp::detail {
namespace {

TEST(P2pStagingPool, OneBufferPerOperationInFlightReusedAndTrimmed) {
  std::map<const void*, size_t> registered;
  size_t registrations = 0;
  P2pStagingPool pool([&](const void* p, size_t n) { registered[p] = n; ++registrations; },
                      [&](const void* p, size_t) { EXPECT_EQ(registered.erase(p), 1u) << "freed twice or never made"; },
                      /*keep=*/1 << 20);
  const std::byte* first = nullptr;
  {
    auto a = pool.take(100);
    auto b = pool.take(100);
    EXPECT_NE(a.data(), b.data()) << "two operations in flight got one buffer";
    EXPECT_EQ(pool.leased(), 2u);
    first = a.data();
  }
  EXPECT_EQ(pool.leased(), 0u);
  EXPECT_EQ(registrations, 2u);
  {
    auto c = pool.take(4096);  // fits a kept buffer: no new allocation
    EXPECT_EQ(c.data(), first) << "the buffer given back last is taken first";
    EXPECT_EQ(registrations, 2u);
    // Above keep, in the other free buffer, which grows: its small allocation is freed first.
    std::optional<P2pStagingPool::Lease> big(pool.take(size_t{3} << 20));
    EXPECT_EQ(registrations, 3u);
    EXPECT_EQ(registered.size(), 2u);
    big.reset();
    EXPECT_EQ(registered.size(), 2u) << "the large buffer went while another lease was out";
  }
  EXPECT_EQ(registered.size(), 1u) << "the large buffer stayed once none was out";
  {
    P2pStagingPool::Lease moved = pool.take(8);
    P2pStagingPool::Lease to(std::move(moved));
    EXPECT_EQ(pool.leased(), 1u) << "a moved lease counts once";
  }
  EXPECT_EQ(pool.leased(), 0u);
}

// A buffer whose registration failed is not made and its slot stays free; a buffer abandoned
// by an operation that failed (the network may still hold it) is neither reused nor freed before
// the pool goes.
TEST(P2pStagingPool, FailedRegistrationAndAbandonedBuffers) {
  std::map<const void*, size_t> registered;
  bool refuse = true;
  P2pStagingPool pool(
      [&](const void* p, size_t n) {
        if (refuse) throw std::runtime_error("registration refused");
        registered[p] = n;
      },
      [&](const void* p, size_t) { EXPECT_EQ(registered.erase(p), 1u) << "freed twice or never made"; },
      /*keep=*/1 << 20);
  EXPECT_THROW(pool.take(size_t{2} << 20), std::runtime_error);
  EXPECT_EQ(pool.leased(), 0u);
  refuse = false;
  const std::byte* kept = nullptr;
  {
    auto a = pool.take(size_t{2} << 20);  // above keep
    kept = a.data();
    a.abandon();
  }
  EXPECT_EQ(pool.leased(), 0u);
  EXPECT_EQ(registered.count(kept), 1u) << "an abandoned buffer was freed";
  {
    auto b = pool.take(size_t{2} << 20);
    EXPECT_NE(b.data(), kept) << "an abandoned buffer was reused";
  }
  EXPECT_EQ(registered.count(kept), 1u) << "trimmed while a buffer was abandoned";
  EXPECT_EQ(registered.size(), 2u);
}

}  // namespace
}  // namespace smddp::detail
