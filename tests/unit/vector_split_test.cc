// The split of a CUDA reduction into scalar head, 16-byte vectors and scalar tail
// (reduce/vector_split.h), checked here since the kernel itself runs only on a GPU: over every
// element size, count up to a few vectors and offset of each operand within 16 bytes, every
// element is covered exactly once, every vector starts on a 16-byte boundary of every operand,
// and vectors are used whenever the operands line up and at least one whole vector fits.
#include "reduce/vector_split.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace smddp::reduce {
namespace {

TEST(VectorSplit, CoversEveryElementOnceWithAlignedVectors) {
  for (size_t elem : {size_t{1}, size_t{2}, size_t{4}, size_t{8}})
    for (size_t count = 0; count <= 70; ++count)
      for (uintptr_t dst_off = 0; dst_off < kVectorBytes; dst_off += elem)
        for (uintptr_t src_off = 0; src_off < kVectorBytes; src_off += elem) {
          // A destination, a source at its own offset and a second source at the destination's.
          const uintptr_t addrs[3] = {4096 + dst_off, 8192 + src_off, 65536 + dst_off};
          const VectorSplit s = vector_split(addrs, 3, count, elem);
          const std::string at = "elem " + std::to_string(elem) + ", count " + std::to_string(count) +
                                 ", offsets " + std::to_string(dst_off) + "/" + std::to_string(src_off);
          const size_t per = kVectorBytes / elem;
          ASSERT_EQ(s.head + s.vectors * per + s.tail, count) << at;
          std::vector<int> seen(count, 0);
          for (size_t k = 0; k < s.head + s.tail; ++k) {
            const size_t i = scalar_element(s, k, elem);
            ASSERT_LT(i, count) << at;
            ++seen[i];
          }
          for (size_t v = 0; v < s.vectors; ++v) {
            const size_t first = s.head + v * per;
            for (const uintptr_t a : addrs) ASSERT_EQ((a + first * elem) % kVectorBytes, 0u) << at << ", vector " << v;
            for (size_t e = 0; e < per; ++e) ++seen[first + e];
          }
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(seen[i], 1) << at << ", element " << i;
          const size_t head = dst_off == 0 ? 0 : (kVectorBytes - dst_off) / elem;
          const bool lined_up = dst_off == src_off && count >= head + per;
          EXPECT_EQ(s.vectors > 0, lined_up) << at;
          if (lined_up) {
            EXPECT_LT(s.tail, per) << at;
          }
        }
}

// Element-misaligned pointers (possible for raw memory, never for a tensor) stay scalar.
TEST(VectorSplit, OperandsNotAlignedToTheirElementStayScalar) {
  const uintptr_t addrs[2] = {4097, 8193};
  const VectorSplit s = vector_split(addrs, 2, 100, 4);
  EXPECT_EQ(s.head, 100u);
  EXPECT_EQ(s.vectors, 0u);
  EXPECT_EQ(s.tail, 0u);
}

}  // namespace
}  // namespace smddp::reduce
