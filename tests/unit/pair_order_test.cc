// The numbering of point-to-point messages across nodes (core/pair_order.h): each direction of
// each pair counts on its own; a receive from any rank holds later receives back until it knows
// which message it took, and a number it took out of turn is skipped by the receives after it.
#include <gtest/gtest.h>

#include "core/pair_order.h"

namespace smddp::detail {
namespace {

TEST(PairOrder, EachPeerAndDirectionCountsOnItsOwn) {
  PairOrder o(3);
  EXPECT_EQ(o.next_send(1), 0u);
  EXPECT_EQ(o.next_send(1), 1u);
  EXPECT_EQ(o.next_send(2), 0u);
  EXPECT_EQ(o.next_recv(1), 0u);
  EXPECT_EQ(o.next_recv(2), 0u);
  EXPECT_EQ(o.next_recv(1), 1u);
}

TEST(PairOrder, ReceiveFromAnyRankHoldsLaterReceivesBack) {
  PairOrder o(3);
  EXPECT_EQ(o.next_recv(1), 0u);
  ASSERT_TRUE(o.open_any());
  EXPECT_FALSE(o.open_any());  // one at a time
  EXPECT_FALSE(o.next_recv(1).has_value());
  o.close_any(1, 1);  // took rank 1's next message
  EXPECT_EQ(o.next_recv(1), 2u);
  ASSERT_TRUE(o.open_any());
  o.close_any();  // took a message inside the node
  EXPECT_EQ(o.next_recv(1), 3u);
}

TEST(PairOrder, NumberTakenOutOfTurnIsSkipped) {
  PairOrder o(2);
  ASSERT_TRUE(o.open_any());
  o.close_any(1, 2);  // message 2 arrived first (a provider that reorders)
  EXPECT_EQ(o.next_recv(1), 0u);
  EXPECT_EQ(o.next_recv(1), 1u);
  EXPECT_EQ(o.next_recv(1), 3u);
  EXPECT_EQ(o.next_recv(1), 4u);
}

TEST(PairOrder, NumbersWrapAtTheWireWidth) {
  PairOrder o(2);
  for (uint32_t k = 0; k < 0x7FFF; ++k) o.next_recv(1);
  ASSERT_TRUE(o.open_any());
  o.close_any(1, 0x7FFF + 0x8000);  // the wire carries 15 bits: this is message 0x7FFF
  EXPECT_EQ(*o.next_recv(1) & 0x7FFFu, 0u);
}

}  // namespace
}  // namespace smddp::detail
