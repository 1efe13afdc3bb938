#include "algorithms/node_stages.h"

#include <algorithm>

namespace smddp::algorithms {

namespace {
size_t longest(const ShardMap& shards) {
  size_t n = 0;
  for (const auto& s : shards) n = std::max(n, s.count());
  return n;
}
}  // namespace

ShardMap contiguous_shards(size_t first, size_t count, int L) {
  ShardMap m(static_cast<size_t>(L));
  for (int j = 0; j < L; ++j) {
    const auto b = patterns::block(count, L, j);
    m[static_cast<size_t>(j)].pieces.push_back({first + b.begin, b.count});
  }
  return m;
}

void node_reduce_scatter(Context& ctx, const void* send, void* dst, const ShardMap& shards, DataType t, Reduction op) {
  const int L = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(t), chunk = std::max<size_t>(1, slot_elems(ctx, t, L));
  const Shard& mine = shards[static_cast<size_t>(me)];
  const size_t my_count = mine.count();
  if (L == 1) {  // alone on the node: one pass from the input (premul_sum still scales), no rounds
    for_each_piece(mine, 0, my_count, [&](size_t b, size_t s, size_t n) {
      const void* src[1] = {at(send, b, es)};
      ctx.dev.reduce({at(dst, s, es), src, 1, n, t, op, 1});
    });
    return;
  }
  std::vector<const void*> srcs(static_cast<size_t>(L));
  for (size_t c = 0; c < patterns::num_chunks(longest(shards), chunk); ++c) {
    const size_t off = c * chunk;
    const int p = ctx.shm.begin_round();
    // Stage my input for every rank's shard window: sub-slot j of my slot holds shard j's part.
    for (int j = 0; j < L; ++j) {
      std::byte* sub = at(ctx.shm.slot(me, p), static_cast<size_t>(j) * chunk, es);
      for_each_piece(shards[static_cast<size_t>(j)], off, chunk, [&](size_t b, size_t s, size_t n) {
        ctx.dev.copy(at(sub, s - off, es), at(send, b, es), n * es);
      });
    }
    ctx.arrive();
    ctx.wait_all();
    if (off >= my_count) continue;
    for (int j = 0; j < L; ++j) srcs[static_cast<size_t>(j)] = at(ctx.shm.slot(j, p), static_cast<size_t>(me) * chunk, es);
    // (avg: the node's mean, where a multi-stage avg averages by stage: net_exchange.h)
    ctx.dev.reduce({at(dst, off, es), srcs.data(), L, std::min(chunk, my_count - off), t, op,
                    op.op == ReduceOp::avg ? L : 1});
  }
}

void node_allgather(Context& ctx, void* buf, const ShardMap& shards, DataType t) {
  const int L = ctx.size(), me = ctx.rank();
  if (L == 1) return;  // nobody to share with
  const size_t es = dtype_size(t), chunk = std::max<size_t>(1, slot_elems(ctx, t));
  for (size_t c = 0; c < patterns::num_chunks(longest(shards), chunk); ++c) {
    const size_t off = c * chunk;
    const int p = ctx.shm.begin_round();
    for_each_piece(shards[static_cast<size_t>(me)], off, chunk, [&](size_t b, size_t s, size_t n) {
      ctx.dev.copy(at(ctx.shm.slot(me, p), s - off, es), at(buf, b, es), n * es);
    });
    ctx.arrive();
    ctx.wait_all();
    for (int j = 0; j < L; ++j) {
      if (j == me) continue;
      for_each_piece(shards[static_cast<size_t>(j)], off, chunk, [&](size_t b, size_t s, size_t n) {
        ctx.dev.copy(at(buf, b, es), at(ctx.shm.slot(j, p), s - off, es), n * es);
      });
    }
  }
}

}  // namespace smddp::algorithms
