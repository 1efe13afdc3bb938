// The network stages of the hierarchical algorithms. They run among `peers`: one rank per node,
// all with the same local rank, indexed by node (peers[n] is on node n; I am peers[me]). Every
// exchange is direct: N-1 messages out and in at once, each of them its final size, so a stage
// costs one network round trip and each node sends exactly its share of the data.
#pragma once

#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/net_exchange.h"

namespace smddp::algorithms {

// Bytes of the message per pipelined slice (SMDDP_HIER_SLICE); defined in allreduce_hier.cc.
size_t hier_slice_bytes();

struct Piece {
  std::byte* ptr = nullptr;
  size_t count = 0;  // elements
};

// The reduction for the last stage of a multi-stage reduction: avg divides there (by
// final_divisor), premul_sum already scaled its inputs in the first stage.
inline Reduction final_stage(Reduction r, DataType t) { return r.op == ReduceOp::avg ? r : partial(r, false, t); }
// What the last stage's avg divides by: the world size, or the number of nodes where the first
// stage already averaged each node's ranks (averages_by_stage).
inline int final_divisor(Reduction r, DataType t, int world, int nodes) {
  return averages_by_stage(r, t) ? nodes : world;
}

// Reduce-scatter among the peers, posting half: parts[n] is my partial of node n's piece; it goes
// to peers[n]. The other nodes' partials of my piece (parts[me].count each) land in scratch,
// node n's at n x parts[me].count (scratch holds N such blocks; block me stays unused).
inline void post_peer_reduce_scatter(NetExchange& x, uint32_t step, const std::vector<int>& peers, int me,
                                     const std::vector<Piece>& parts, std::byte* scratch, size_t es) {
  const size_t mine = parts[static_cast<size_t>(me)].count;
  for (size_t n = 0; n < peers.size(); ++n) {
    if (static_cast<int>(n) == me) continue;
    x.recv(peers[n], scratch + n * mine * es, mine * es, step);
    x.send(peers[n], parts[n].ptr, parts[n].count * es, step);
  }
}

// ... and finishing half: waits, then reduces the N partials of my piece in node order into dst
// (which may be parts[me].ptr itself).
inline void finish_peer_reduce_scatter(Context& ctx, NetExchange& x, int me, const std::vector<Piece>& parts,
                                       const std::byte* scratch, void* dst, DataType t, Reduction op, int divisor) {
  x.wait();
  const size_t mine = parts[static_cast<size_t>(me)].count, es = dtype_size(t);
  if (mine == 0) return;
  std::vector<const void*> srcs(parts.size());
  for (size_t n = 0; n < parts.size(); ++n)
    srcs[n] = static_cast<int>(n) == me ? parts[n].ptr : scratch + n * mine * es;
  ctx.dev.reduce({dst, srcs.data(), static_cast<int>(parts.size()), mine, t, op, divisor});
}

// Allgather among the peers: parts[me] goes to every peer, parts[n] arrives from peers[n].
// Waiting is the caller's (x.wait()).
inline void post_peer_allgather(NetExchange& x, uint32_t step, const std::vector<int>& peers, int me,
                                const std::vector<Piece>& parts, size_t es) {
  const Piece& mine = parts[static_cast<size_t>(me)];
  for (size_t n = 0; n < peers.size(); ++n) {
    if (static_cast<int>(n) == me) continue;
    x.recv(peers[n], parts[n].ptr, parts[n].count * es, step);
    x.send(peers[n], mine.ptr, mine.count * es, step);
  }
}

}  // namespace smddp::algorithms
