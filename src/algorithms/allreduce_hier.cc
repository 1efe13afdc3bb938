// Hierarchical allreduce for communicators that span nodes with L ranks each:
//
//   1. inside each node, reduce-scatter through shared memory: local rank l ends with shard l
//      (block l of L) of the node's sum;
//   2. across nodes, allreduce of shard l among the ranks with local rank l (one per node) over
//      libfabric, as a ring: reduce-scatter then allgather of N parts;
//   3. inside each node, allgather of the shards through shared memory.
//
// Each node sends 2(N-1)/N of the message over the network in step 2 (L ranks x S/L each x
// 2(N-1)/N), the optimum; a flat ring over all N*L ranks sends more whenever ring neighbours sit
// on different nodes. Every shard is reduced along one fixed order and then copied, so all ranks
// get the same bits. avg divides once, at the end; premul_sum scales only in step 1.
#include <algorithm>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/net_exchange.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

namespace {

// Step 1: rank l receives the node-local reduction of shard l into dst + shard_l.begin.
void local_reduce_scatter(Context& ctx, const void* send, void* dst, size_t count, DataType t, Reduction op) {
  const int L = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(t), chunk = std::max<size_t>(1, slot_elems(ctx, t, L));
  size_t longest = 0;
  for (int j = 0; j < L; ++j) longest = std::max(longest, patterns::block(count, L, j).count);
  std::vector<const void*> srcs(static_cast<size_t>(L));
  const auto mine = patterns::block(count, L, me);
  for (size_t c = 0; c < patterns::num_chunks(longest, chunk); ++c) {
    const size_t off = c * chunk;
    const int p = ctx.shm.begin_round();
    for (int j = 0; j < L; ++j) {
      const auto b = patterns::block(count, L, j);
      if (off < b.count)
        ctx.dev.copy(at(ctx.shm.slot(me, p), static_cast<size_t>(j) * chunk, es), at(send, b.begin + off, es),
                     std::min(chunk, b.count - off) * es);
    }
    ctx.shm.arrive();
    ctx.shm.wait_all(ctx.op);
    if (off >= mine.count) continue;
    for (int j = 0; j < L; ++j) srcs[static_cast<size_t>(j)] = at(ctx.shm.slot(j, p), static_cast<size_t>(me) * chunk, es);
    ctx.dev.reduce({at(dst, mine.begin + off, es), srcs.data(), L, std::min(chunk, mine.count - off), t, op, 1});
  }
}

// Step 3: every rank's shard (in buf) to every local rank.
void local_allgather(Context& ctx, void* buf, size_t count, DataType t) {
  const int L = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(t), chunk = std::max<size_t>(1, slot_elems(ctx, t));
  size_t longest = 0;
  for (int j = 0; j < L; ++j) longest = std::max(longest, patterns::block(count, L, j).count);
  const auto mine = patterns::block(count, L, me);
  for (size_t c = 0; c < patterns::num_chunks(longest, chunk); ++c) {
    const size_t off = c * chunk;
    const int p = ctx.shm.begin_round();
    if (off < mine.count) ctx.dev.copy(ctx.shm.slot(me, p), at(buf, mine.begin + off, es), std::min(chunk, mine.count - off) * es);
    ctx.shm.arrive();
    ctx.shm.wait_all(ctx.op);
    for (int j = 0; j < L; ++j) {
      const auto b = patterns::block(count, L, j);
      if (j != me && off < b.count)
        ctx.dev.copy(at(buf, b.begin + off, es), ctx.shm.slot(j, p), std::min(chunk, b.count - off) * es);
    }
  }
}

// Step 2: ring allreduce of buf[0, n) among `ring` (global ranks, one per node); `pos` is mine.
void ring_allreduce(Context& ctx, void* buf, size_t n, DataType t, Reduction op, const std::vector<int>& ring, int pos) {
  const int N = static_cast<int>(ring.size());
  if (N == 1 || n == 0) return;
  const size_t es = dtype_size(t);
  const int next = ring[static_cast<size_t>((pos + 1) % N)], prev = ring[static_cast<size_t>((pos + N - 1) % N)];
  std::vector<std::byte> tmp(patterns::block(n, N, 0).count * es + 1);
  NetExchange x(ctx);
  uint32_t step = 0;
  for (int s = 0; s < N - 1; ++s, ++step) {  // reduce-scatter: part (pos - s - 1) accumulates here
    const auto out = patterns::block(n, N, (pos - s + 2 * N) % N);
    const auto in = patterns::block(n, N, (pos - s - 1 + 2 * N) % N);
    x.send(next, at(buf, out.begin, es), out.count * es, step);
    x.recv(prev, tmp.data(), in.count * es, step);
    x.wait();
    const void* srcs[2] = {tmp.data(), at(buf, in.begin, es)};
    ctx.dev.reduce({at(buf, in.begin, es), srcs, 2, in.count, t, op, 1});
  }
  for (int s = 0; s < N - 1; ++s, ++step) {  // allgather: part (pos + 1 - s) is complete here
    const auto out = patterns::block(n, N, (pos + 1 - s + 2 * N) % N);
    const auto in = patterns::block(n, N, (pos - s + 2 * N) % N);
    x.send(next, at(buf, out.begin, es), out.count * es, step);
    x.recv(prev, at(buf, in.begin, es), in.count * es, step);
    x.wait();
  }
}

}  // namespace

void allreduce_hier(Context& ctx, const CollArgs& a) {
  const auto& topo = *ctx.topo;
  const int L = ctx.size();
  const size_t es = dtype_size(a.dtype);
  local_reduce_scatter(ctx, a.send, a.recv, a.count, a.dtype, partial(a.op, true));
  const auto shard = patterns::block(a.count, L, ctx.rank());
  ring_allreduce(ctx, at(a.recv, shard.begin, es), shard.count, a.dtype, partial(a.op, false), topo.peers_across_nodes(),
                 topo.node());
  if (a.op.op == ReduceOp::avg && shard.count) {
    const void* src[1] = {at(a.recv, shard.begin, es)};
    ctx.dev.reduce({at(a.recv, shard.begin, es), src, 1, shard.count, a.dtype, ReduceOp::avg, topo.size});
  }
  local_allgather(ctx, a.recv, a.count, a.dtype);
}

}  // namespace smddp::algorithms
