// The counters of a shared-memory FIFO are written by another process (the peer's head when this
// rank pops, its tail when this rank pushes): any pair of counters must give copies that stay
// inside the ring and move no more than was asked, at most what is there (a pop) or what room
// there is (a push). Between consistent counters (0 to capacity apart) the spans are the ones
// shm::Group always used, and what is pushed pops out again unchanged.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "transport/shm/fifo_ring.h"

namespace {

uint64_t word(const uint8_t* data, size_t size, size_t* at) {
  uint64_t v = 0;
  const size_t n = *at < size ? std::min<size_t>(8, size - *at) : 0;
  std::memcpy(&v, data + *at, n);
  *at += n;
  return v;
}

// A span that stays inside a ring of `cap` bytes and touches no byte twice.
void check_inside(const smddp::shm::RingSpan& s, size_t cap) {
  if (s.bytes() > cap || s.pos >= cap || s.first > cap - s.pos || s.second > s.pos) std::abort();
  if (s.second && s.first != cap - s.pos) std::abort();  // wraps only at the ring's end
}

}  // namespace

// Input: a byte giving the capacity (a power of two, 1 B to 64 KiB), then head, tail and the
// number of bytes asked for (8 bytes each, little-endian; missing bytes are 0).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace smddp::shm;
  if (size < 1) return 0;
  const size_t cap = size_t{1} << (data[0] % 17);
  size_t at = 1;
  const uint64_t head = word(data, size, &at), tail = word(data, size, &at);
  const size_t want = static_cast<size_t>(word(data, size, &at));
  const bool consistent = head - tail <= cap;

  const size_t filled = ring_filled(head, tail, cap);
  if (filled > cap || (consistent && filled != head - tail)) std::abort();
  const RingSpan push = push_span(head, tail, cap, want), pop = pop_span(head, tail, cap, want);
  check_inside(push, cap);
  check_inside(pop, cap);
  if (push.bytes() > want || push.bytes() > cap - filled) std::abort();
  if (pop.bytes() > want || pop.bytes() > filled) std::abort();
  if (push.pos != (head & (cap - 1)) || pop.pos != (tail & (cap - 1))) std::abort();
  if (consistent) {  // shm::Group's arithmetic before the counters were distrusted
    if (push.bytes() != std::min<size_t>(want, cap - (head - tail))) std::abort();
    if (pop.bytes() != std::min<size_t>(want, head - tail)) std::abort();
  }

  // The copies themselves, into and out of a ring of exactly `cap` bytes (ASan guards its ends).
  std::vector<uint8_t> ring(cap, 0xee), in(std::min(want, cap) + 1), out(cap);  // never empty: no null to memcpy
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 1);
  std::memcpy(out.data(), ring.data() + pop.pos, pop.first);
  std::memcpy(out.data() + pop.first, ring.data(), pop.second);
  std::memcpy(ring.data() + push.pos, in.data(), push.first);
  std::memcpy(ring.data(), in.data() + push.first, push.second);
  // A consumer at tail now pops what was there and then what was pushed, unchanged.
  const RingSpan all = pop_span(head + push.bytes(), tail, cap, cap);
  check_inside(all, cap);
  if (consistent) {
    if (all.bytes() != head - tail + push.bytes()) std::abort();
    std::memcpy(out.data(), ring.data() + all.pos, all.first);
    std::memcpy(out.data() + all.first, ring.data(), all.second);
    if (std::memcmp(out.data() + (head - tail), in.data(), push.bytes()) != 0) std::abort();
  }
  return 0;
}
