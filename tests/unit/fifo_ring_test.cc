// The FIFO ring arithmetic of shm::Group (fifo_ring.h): between consistent counters what it always
// was; counters a hostile or corrupt peer wrote (more than the capacity apart, either way) count as
// a full ring, so no copy leaves the ring (the two regression inputs of tests/fuzz/regressions/fifo_ring).
#include <gtest/gtest.h>

#include "transport/shm/fifo_ring.h"

namespace smddp::shm {
namespace {

constexpr size_t kCap = 64;

TEST(FifoRing, ConsistentCountersGiveTheSpansOfARing) {
  EXPECT_EQ(ring_filled(100, 90, kCap), 10u);
  const RingSpan push = push_span(/*head=*/100, /*tail=*/90, kCap, 60);  // 54 bytes of room
  EXPECT_EQ(push.bytes(), 54u);
  EXPECT_EQ(push.pos, 100 % kCap);
  EXPECT_EQ(push.first, kCap - 100 % kCap);  // to the ring's end, then from its start
  EXPECT_EQ(push.second, 54 - push.first);
  const RingSpan pop = pop_span(100, 90, kCap, 20);  // only 10 there
  EXPECT_EQ(pop.bytes(), 10u);
  EXPECT_EQ(pop.pos, 90 % kCap);
}

TEST(FifoRing, CountersThatWrapModulo2To64StayConsistent) {
  const uint64_t tail = ~uint64_t{0} - 3, head = tail + 10;  // head wrapped past 2^64
  EXPECT_EQ(ring_filled(head, tail, kCap), 10u);
  EXPECT_EQ(pop_span(head, tail, kCap, 100).bytes(), 10u);
}

TEST(FifoRing, AHeadMoreThanTheCapacityAheadIsAFullRingNotAnOverrun) {
  // A peer's head 1000 bytes past our tail in a 64-byte ring: a pop takes at most the ring.
  const RingSpan pop = pop_span(/*head=*/1000, /*tail=*/0, kCap, 500);
  EXPECT_EQ(pop.bytes(), kCap);
  EXPECT_LE(pop.pos + pop.first, kCap);
  EXPECT_LE(pop.second, pop.pos);
  EXPECT_EQ(push_span(1000, 0, kCap, 8).bytes(), 0u);  // and nothing can be pushed
}

TEST(FifoRing, ATailAheadOfTheHeadIsAFullRingNotAnOverrun) {
  // A consumer's tail 5 bytes past our head: head - tail wraps to nearly 2^64.
  EXPECT_EQ(ring_filled(10, 15, kCap), kCap);
  EXPECT_EQ(push_span(10, 15, kCap, 100).bytes(), 0u);  // before the fix: 69 bytes into a 64-byte ring
}

}  // namespace
}  // namespace smddp::shm
