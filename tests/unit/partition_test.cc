#include <gtest/gtest.h>

#include "patterns/partition.h"

using smddp::patterns::block;
using smddp::patterns::chunk_at;
using smddp::patterns::num_chunks;

TEST(Partition, BlocksCoverEveryElementOnce) {
  for (size_t count : {0, 1, 7, 8, 1023, 1 << 20}) {
    for (int parts : {1, 2, 3, 5, 8}) {
      size_t next = 0;
      for (int i = 0; i < parts; ++i) {
        auto r = block(count, parts, i);
        EXPECT_EQ(r.begin, next);
        EXPECT_LE(r.count, count / parts + 1);
        EXPECT_GE(r.count, count / parts);
        next = r.end();
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(Partition, ChunksCoverTheRange) {
  EXPECT_EQ(num_chunks(0, 10), 0u);
  EXPECT_EQ(num_chunks(10, 10), 1u);
  EXPECT_EQ(num_chunks(11, 10), 2u);
  EXPECT_EQ(chunk_at(11, 10, 1).begin, 10u);
  EXPECT_EQ(chunk_at(11, 10, 1).count, 1u);
}
