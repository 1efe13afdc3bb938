// Latency-optimal allreduce across nodes for small messages: two rounds in all.
//
//   1. inside each node, one-shot allreduce through shared memory: every local rank gets the
//      node's partial (all of them the same bits: each reduces in local-rank order);
//   2. across nodes, among the ranks with my local rank: every rank sends its node's partial to
//      the N-1 others and reduces the N partials in node order.
//
// Every rank reduces the same N values in the same order, so all ranks get the same bits. Each
// node sends L(N-1) x S bytes: more than the hierarchical algorithm's 2(N-1)/N x S, which is why
// the selector uses this one only up to SMDDP_HIER_SMALL_MAX bytes, where rounds cost more than
// bytes.
#include <vector>

#include "algorithms/hier_exchange.h"
#include "algorithms/scratch_pool.h"

namespace smddp::algorithms {

void allreduce_one_shot(Context&, const CollArgs&);

void allreduce_hier_small(Context& ctx, const CollArgs& a) {
  const auto& topo = *ctx.topo;
  const int N = topo.num_nodes(), me = topo.node();
  const size_t es = dtype_size(a.dtype);
  CollArgs local = a;
  local.op = partial(a.op, true, a.dtype);  // (an avg of halves: the node's mean, one_shot's)
  allreduce_one_shot(ctx, local);
  if (a.count == 0) return;
  // Node n's partial arrives in block n of scratch; block me is my own, in recv.
  std::byte* scratch = scratch_buffer(ctx, 0, static_cast<size_t>(N) * a.count * es);
  std::vector<Piece> parts(static_cast<size_t>(N));
  for (int n = 0; n < N; ++n) parts[static_cast<size_t>(n)] = {scratch + static_cast<size_t>(n) * a.count * es, a.count};
  parts[static_cast<size_t>(me)].ptr = static_cast<std::byte*>(a.recv);
  NetExchange x(ctx);
  post_peer_allgather(x, 0, topo.peers_across_nodes(), me, parts, es);
  x.wait();
  std::vector<const void*> srcs(static_cast<size_t>(N));
  for (int n = 0; n < N; ++n) srcs[static_cast<size_t>(n)] = parts[static_cast<size_t>(n)].ptr;
  ctx.dev.reduce({a.recv, srcs.data(), N, a.count, a.dtype, final_stage(a.op, a.dtype),
                   final_divisor(a.op, a.dtype, topo.size, N)});
}

}  // namespace smddp::algorithms
