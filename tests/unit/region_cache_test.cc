// The registration cache's bookkeeping: containment, replacement, removal.
#include <gtest/gtest.h>

#include <string>

#include "transport/ofi/region_cache.h"

namespace smddp::ofi {
namespace {

TEST(RegionCache, FindsOnlyWhollyContainedRanges) {
  char a[100] = {}, b[50] = {};
  RegionCache<std::string> c;
  EXPECT_FALSE(c.add(a, sizeof a, "A"));
  EXPECT_FALSE(c.add(b, sizeof b, "B"));
  ASSERT_NE(c.find(a, 100), nullptr);
  EXPECT_EQ(*c.find(a, 100), "A");
  EXPECT_EQ(*c.find(a + 10, 90), "A");
  EXPECT_EQ(*c.find(b + 49, 1), "B");
  EXPECT_EQ(c.find(a + 10, 91), nullptr);  // runs past the end
  EXPECT_EQ(c.find(b + 49, 2), nullptr);
  char other[8] = {};
  EXPECT_EQ(c.find(other, 1), nullptr);
}

TEST(RegionCache, ReplaceAndRemoveHandBackTheOldHandle) {
  char a[64] = {};
  RegionCache<int> c;
  EXPECT_FALSE(c.add(a, 32, 1));
  EXPECT_EQ(c.find(a, 64), nullptr);
  auto old = c.add(a, 64, 2);  // grown: the old registration comes back to be closed
  ASSERT_TRUE(old);
  EXPECT_EQ(*old, 1);
  EXPECT_EQ(*c.find(a, 64), 2);
  auto gone = c.remove(a);
  ASSERT_TRUE(gone);
  EXPECT_EQ(*gone, 2);
  EXPECT_EQ(c.find(a, 1), nullptr);
  EXPECT_FALSE(c.remove(a));
  EXPECT_EQ(c.size(), 0u);
}

}  // namespace
}  // namespace smddp::ofi
