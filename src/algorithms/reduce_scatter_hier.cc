// Hierarchical reduce_scatter across N nodes of L ranks. Rank g's output is block g of the
// reduction; the blocks of the N ranks with local rank l form local rank l's shard. Per slice of
// the block (SMDDP_HIER_SLICE bytes of the whole input):
//
//   1. inside each node, reduce-scatter through shared memory: local rank l gets the node's
//      partial of its shard (N pieces, one per node);
//   2. across nodes, among the ranks with local rank l: each sends piece n to the rank on node n
//      and reduces the N partials of its own block in node order.
//
// Each node sends L x (N-1) partial blocks = (N-1)/N of the input, the optimum. Slices are
// pipelined two deep: slice k's shared-memory stage runs while slice k-1 is on the network.
#include <algorithm>
#include <vector>

#include "algorithms/hier_exchange.h"
#include "algorithms/node_stages.h"
#include "algorithms/scratch_pool.h"

namespace smddp::algorithms {

namespace {
struct SliceState {
  explicit SliceState(Context& ctx) : x(ctx) {}
  NetExchange x;
  patterns::Range range;                 // of the block
  std::byte* partial = nullptr;  // my node's partials of my shard, N blocks
  std::byte* scratch = nullptr;  // the other nodes' partials of my block
  std::vector<Piece> parts;
};
}  // namespace

void reduce_scatter_hier(Context& ctx, const CollArgs& a) {
  const auto& topo = *ctx.topo;
  const int L = ctx.size(), N = topo.num_nodes(), me = topo.node();
  const size_t es = dtype_size(a.dtype);
  const std::vector<int> peers = topo.peers_across_nodes();
  const size_t slice = std::max<size_t>(1, hier_slice_bytes() / es / static_cast<size_t>(topo.size));
  const size_t K = patterns::num_chunks(a.count, slice);
  SliceState st[2] = {SliceState(ctx), SliceState(ctx)};

  auto start = [&](size_t k) {
    SliceState& s = st[k % 2];
    s.range = patterns::chunk_at(a.count, slice, k);
    ShardMap shards(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l)
      for (int n = 0; n < N; ++n) {
        const auto g = static_cast<size_t>(topo.node_ranks[static_cast<size_t>(n)][static_cast<size_t>(l)]);
        shards[static_cast<size_t>(l)].pieces.push_back({g * a.count + s.range.begin, s.range.count});
      }
    const size_t bytes = static_cast<size_t>(N) * s.range.count * es;
    s.partial = scratch_buffer(ctx, 2 * (k % 2), bytes);
    s.scratch = scratch_buffer(ctx, 2 * (k % 2) + 1, bytes);
    node_reduce_scatter(ctx, a.send, s.partial, shards, a.dtype, partial(a.op, true, a.dtype));
    s.parts.assign(static_cast<size_t>(N), {});
    for (int n = 0; n < N; ++n)
      s.parts[static_cast<size_t>(n)] = {s.partial + static_cast<size_t>(n) * s.range.count * es, s.range.count};
    post_peer_reduce_scatter(s.x, static_cast<uint32_t>(k), peers, me, s.parts, s.scratch, es);
  };
  auto finish = [&](size_t k) {
    SliceState& s = st[k % 2];
    finish_peer_reduce_scatter(ctx, s.x, me, s.parts, s.scratch, at(a.recv, s.range.begin, es), a.dtype,
                               final_stage(a.op, a.dtype), final_divisor(a.op, a.dtype, topo.size, N));
  };
  for (size_t k = 0; k < K + 1; ++k) {
    if (k < K) start(k);
    if (k >= 1) finish(k - 1);
  }
}

}  // namespace smddp::algorithms
