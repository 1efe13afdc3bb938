// Where a push into or a pop from one of shm::Group's byte FIFOs goes in its ring. The two
// counters live in the shared segment, each written by another process: head (bytes ever pushed,
// the producer's) and tail (bytes ever popped, the consumer's). Neither side trusts the other's:
// counters that put more than the ring's capacity between them (a corrupt or hostile peer) count
// as a full ring, so a copy never runs past the ring's end; between consistent counters (0 to
// capacity apart, the only ones our ranks write) the spans are what they always were. Pure
// (tests/fuzz/fifo_ring_fuzz.cc).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace smddp::shm {

// One copy into or out of a ring of `cap` bytes: [pos, pos + first), then [0, second).
struct RingSpan {
  size_t pos = 0, first = 0, second = 0;
  size_t bytes() const { return first + second; }
};

// Bytes between the counters, at most `cap` (a power of two). Counters wrap modulo 2^64.
inline size_t ring_filled(uint64_t head, uint64_t tail, size_t cap) {
  return static_cast<size_t>(std::min<uint64_t>(head - tail, cap));
}

// `n` (at most `cap`) bytes from the counter `at` on.
inline RingSpan ring_span(uint64_t at, size_t n, size_t cap) {
  const size_t pos = static_cast<size_t>(at & (cap - 1));
  const size_t first = std::min(n, cap - pos);
  return {pos, first, n - first};
}

// A push of up to `bytes`: as many as there is room for (maybe 0), at head.
inline RingSpan push_span(uint64_t head, uint64_t tail, size_t cap, size_t bytes) {
  return ring_span(head, std::min(bytes, cap - ring_filled(head, tail, cap)), cap);
}

// A pop (or peek) of up to `bytes`: as many as are there (maybe 0), at tail.
inline RingSpan pop_span(uint64_t head, uint64_t tail, size_t cap, size_t bytes) {
  return ring_span(tail, std::min(bytes, ring_filled(head, tail, cap)), cap);
}

}  // namespace smddp::shm
