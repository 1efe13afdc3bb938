// Hierarchical allreduce for communicators that span N nodes with L ranks each. The message is
// cut into slices (SMDDP_HIER_SLICE bytes); for each slice:
//
//   A. inside each node, reduce-scatter through shared memory: local rank l ends with shard l
//      (block l of L) of the node's partial sum;
//   B. across nodes, among the N ranks with local rank l: reduce-scatter of shard l by direct
//      exchange (each sends the N-1 sub-blocks it does not own to their owners, and reduces the
//      N partials of its own sub-block in node order);
//   C. across nodes again: allgather of the reduced sub-blocks among the same N ranks;
//   D. inside each node, allgather of the shards through shared memory.
//
// Each node sends 2(N-1)/N of the message over the network (L ranks x S/L each x 2(N-1)/N), the
// optimum; a flat ring over all N*L ranks sends more whenever ring neighbours sit on different
// nodes. The slices are pipelined three deep: while slice k-1's reduce-scatter and slice k-2's
// allgather are in flight, the ranks run slice k's shared-memory reduce-scatter (and the shared-memory waits drive libfabric's
// progress, see Communicator::Impl), so network and shared-memory work overlap.
//
// Every sub-block is reduced along one fixed order by one rank and then copied, so all ranks get
// the same bits. avg divides once, at the owner; premul_sum scales only in step A.
#include <algorithm>
#include <vector>

#include "algorithms/hier_exchange.h"
#include "algorithms/node_stages.h"
#include "algorithms/scratch_pool.h"
#include "core/config.h"

namespace smddp::algorithms {

namespace {

struct SliceState {
  explicit SliceState(Context& ctx) : rs(ctx), ag(ctx) {}
  NetExchange rs, ag;
  ShardMap shards;           // this slice's shards, per local rank
  std::vector<Piece> parts;  // my shard's sub-block per node
  std::byte* scratch = nullptr;  // the other nodes' partials of my sub-block
};

}  // namespace

size_t hier_slice_bytes() {
  static const size_t v = std::max<int64_t>(4096, config::get_int("SMDDP_HIER_SLICE"));
  return v;
}

void allreduce_hier(Context& ctx, const CollArgs& a) {
  const auto& topo = *ctx.topo;
  const int L = ctx.size(), N = topo.num_nodes(), me = topo.node();
  const std::vector<int> peers = topo.peers_across_nodes();
  const size_t es = dtype_size(a.dtype);
  const size_t slice = std::max<size_t>(static_cast<size_t>(L * N), hier_slice_bytes() / es);
  const size_t K = patterns::num_chunks(a.count, slice);
  // Three slices in flight: A of slice k runs while k-1's reduce-scatter and k-2's allgather travel.
  SliceState st[3] = {SliceState(ctx), SliceState(ctx), SliceState(ctx)};

  auto stage_a_b = [&](size_t k) {  // node reduce-scatter, then post the peers' reduce-scatter
    SliceState& s = st[k % 3];
    const auto r = patterns::chunk_at(a.count, slice, k);
    s.shards = contiguous_shards(r.begin, r.count, L);
    const auto shard = s.shards[static_cast<size_t>(ctx.rank())].pieces[0];
    node_reduce_scatter(ctx, a.send, at(a.recv, shard.begin, es), s.shards, a.dtype, partial(a.op, true, a.dtype));
    s.parts.assign(static_cast<size_t>(N), {});
    for (int n = 0; n < N; ++n) {
      const auto b = patterns::block(shard.count, N, n);
      s.parts[static_cast<size_t>(n)] = {at(a.recv, shard.begin + b.begin, es), b.count};
    }
    s.scratch = scratch_buffer(ctx, k % 3, static_cast<size_t>(N) * s.parts[static_cast<size_t>(me)].count * es);
    post_peer_reduce_scatter(s.rs, static_cast<uint32_t>(2 * k), peers, me, s.parts, s.scratch, es);
  };
  auto stage_b_c = [&](size_t k) {  // reduce my sub-block, then post the peers' allgather
    SliceState& s = st[k % 3];
    Piece& mine = s.parts[static_cast<size_t>(me)];
    finish_peer_reduce_scatter(ctx, s.rs, me, s.parts, s.scratch, mine.ptr, a.dtype, final_stage(a.op, a.dtype),
                               final_divisor(a.op, a.dtype, topo.size, N));
    post_peer_allgather(s.ag, static_cast<uint32_t>(2 * k + 1), peers, me, s.parts, es);
  };
  auto stage_d = [&](size_t k) {  // wait for the allgather, then share the shards in the node
    SliceState& s = st[k % 3];
    s.ag.wait();
    node_allgather(ctx, a.recv, s.shards, a.dtype);
  };
  for (size_t k = 0; k < K + 2; ++k) {
    if (k < K) stage_a_b(k);
    if (k >= 1 && k - 1 < K) stage_b_c(k - 1);
    if (k >= 2) stage_d(k - 2);
  }
}

}  // namespace smddp::algorithms
