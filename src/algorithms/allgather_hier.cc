// Hierarchical allgather across N nodes of L ranks:
//
//   1. across nodes, among the ranks with my local rank: every rank sends its block straight to
//      its place in the N-1 others' outputs (one round of direct exchange);
//   2. inside each node, allgather through shared memory: local rank l holds the blocks of the N
//      ranks with local rank l and copies them to the same places in its node's other outputs.
//
// Each node sends L x (N-1) blocks = (N-1)/N of the output, the optimum (every node must receive
// the other nodes' share); the direct algorithm sends each block to every remote rank, L times
// as much.
#include <vector>

#include "algorithms/hier_exchange.h"
#include "algorithms/node_stages.h"

namespace smddp::algorithms {

void allgather_hier(Context& ctx, const CollArgs& a) {
  const auto& topo = *ctx.topo;
  const int L = ctx.size(), N = topo.num_nodes(), me = topo.node();
  const size_t es = dtype_size(a.dtype), n = a.count;
  if (n == 0) return;
  const std::vector<int> peers = topo.peers_across_nodes();
  std::byte* mine = at(a.recv, static_cast<size_t>(topo.rank) * n, es);
  if (mine != a.send) ctx.dev.copy(mine, a.send, n * es);
  std::vector<Piece> parts(static_cast<size_t>(N));
  for (int k = 0; k < N; ++k)
    parts[static_cast<size_t>(k)] = {at(a.recv, static_cast<size_t>(peers[static_cast<size_t>(k)]) * n, es), n};
  NetExchange x(ctx);
  post_peer_allgather(x, 0, peers, me, parts, es);
  x.wait();
  ShardMap shards(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < N; ++k)
      shards[static_cast<size_t>(l)].pieces.push_back(
          {static_cast<size_t>(topo.node_ranks[static_cast<size_t>(k)][static_cast<size_t>(l)]) * n, n});
  node_allgather(ctx, a.recv, shards, a.dtype);
}

}  // namespace smddp::algorithms
