// The shared-memory stages of the hierarchical algorithms: a reduce-scatter and an allgather
// among the ranks of one node, where each local rank's share (its "shard") may be scattered over
// the buffer. Local rank j's shard is the concatenation of shards[j]'s pieces, in order. The
// hierarchical allreduce gives each rank one contiguous piece; the hierarchical allgather and
// reduce_scatter give it one piece per node (the blocks of the ranks with its local rank).
#pragma once

#include <vector>

#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

struct Shard {
  std::vector<patterns::Range> pieces;  // element ranges of the buffer
  size_t count() const {
    size_t n = 0;
    for (const auto& p : pieces) n += p.count;
    return n;
  }
};
using ShardMap = std::vector<Shard>;  // one per local rank

// Calls f(buffer_offset, shard_offset, n) for the parts of shard positions [off, off + len)
// (clipped to the shard), in order.
template <class F>
void for_each_piece(const Shard& s, size_t off, size_t len, F&& f) {
  size_t base = 0;  // shard offset where the current piece starts
  const size_t end = off + len;
  for (const auto& p : s.pieces) {
    const size_t lo = std::max(off, base), hi = std::min(end, base + p.count);
    if (lo < hi) f(p.begin + (lo - base), lo, hi - lo);
    base += p.count;
    if (base >= end) break;
  }
}

// Local rank me gets, contiguously in dst[0, shards[me].count()), the reduction over the node's
// ranks of its shard of `send`. Every element is reduced in local-rank order by one rank.
void node_reduce_scatter(Context& ctx, const void* send, void* dst, const ShardMap& shards, DataType t, Reduction op);

// Every local rank's shard of `buf` (in place) is copied to the same positions of every other
// local rank's `buf`.
void node_allgather(Context& ctx, void* buf, const ShardMap& shards, DataType t);

// Shards of one contiguous range of `count` elements at `first`: local rank j gets block j of L.
ShardMap contiguous_shards(size_t first, size_t count, int L);

}  // namespace smddp::algorithms
