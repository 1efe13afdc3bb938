// How a reduction kernel splits its elements for 16-byte vector loads and stores
// (reduce_cuda.cu): scalar elements up to the first 16-byte boundary of the destination, whole
// vectors, then the scalar rest. Vectors need every operand at the same offset within 16 bytes;
// otherwise every element stays scalar. Apart from CUDA so that the CPU suite checks the
// arithmetic (tests/unit/vector_split_test.cc): a kernel that got it wrong would skip or repeat
// elements only on some offsets and counts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "reduce/half.h"  // SMDDP_HD

namespace smddp::reduce {

inline constexpr size_t kVectorBytes = 16;

struct VectorSplit {
  size_t head = 0;     // elements [0, head): scalar
  size_t vectors = 0;  // then this many vectors of kVectorBytes / elem elements each
  size_t tail = 0;     // then the last `tail` elements: scalar
};

// `addrs`: the destination's and every source's address (n in all); `elem`: bytes per element
// (1, 2, 4 or 8).
SMDDP_HD VectorSplit vector_split(const uintptr_t* addrs, int n, size_t count, size_t elem) {
  VectorSplit s;
  s.head = count;  // unless every operand lines up
  if (elem == 0 || kVectorBytes % elem != 0) return s;
  const uintptr_t misalign = addrs[0] % kVectorBytes;
  if (misalign % elem != 0) return s;  // not element-aligned: no vector ever lines up
  for (int i = 1; i < n; ++i)
    if (addrs[i] % kVectorBytes != misalign) return s;
  const size_t per = kVectorBytes / elem;
  const size_t head = misalign == 0 ? 0 : (kVectorBytes - misalign) / elem;
  if (head >= count) return s;
  s.head = head;
  s.vectors = (count - head) / per;
  s.tail = count - head - s.vectors * per;
  return s;
}

// The element index of the k-th scalar element (k < head + tail): the head's, then the tail's.
SMDDP_HD size_t scalar_element(const VectorSplit& s, size_t k, size_t elem) {
  return k < s.head ? k : s.head + s.vectors * (kVectorBytes / elem) + (k - s.head);
}

}  // namespace smddp::reduce
