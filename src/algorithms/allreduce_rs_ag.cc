// Bandwidth-optimal allreduce: reduce-scatter then allgather, pipelined chunk by chunk through
// the staging slots.
//
//   per chunk:  stage input -> sync -> rank r reduces segment r of every slot, in rank order,
//               into segment r of its own slot -> sync -> every rank copies every segment out
//
// Each rank reduces 1/size of the data, so the work is spread evenly; each segment is reduced
// by exactly one rank, so all ranks get the same bits. Writing the result over segment r of my
// own slot is safe: only I read segment r of any slot before the second sync.
#include <vector>

#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void rs_ag_rounds(Context& ctx, const void* send, void* recv, size_t count, DataType t, Reduction op,
                  int out_root) {
  const size_t es = dtype_size(t), chunk = slot_elems(ctx, t);
  const int w = ctx.size(), me = ctx.rank();
  std::vector<const void*> srcs(static_cast<size_t>(w));
  for (size_t c = 0; c < patterns::num_chunks(count, chunk); ++c) {
    const auto r = patterns::chunk_at(count, chunk, c);
    const int p = ctx.shm.begin_round();
    ctx.dev.copy(ctx.shm.slot(me, p), at(send, r.begin, es), r.count * es);
    ctx.shm.arrive();
    ctx.shm.wait_all(ctx.op);

    const auto seg = patterns::block(r.count, w, me);
    for (int j = 0; j < w; ++j) srcs[static_cast<size_t>(j)] = at(ctx.shm.slot(j, p), seg.begin, es);
    ctx.dev.reduce({at(ctx.shm.slot(me, p), seg.begin, es), srcs.data(), w, seg.count, t, op, w});
    ctx.shm.arrive();
    ctx.shm.wait_all(ctx.op);

    if (out_root >= 0 && out_root != me) continue;
    for (int j = 0; j < w; ++j) {
      const auto s = patterns::block(r.count, w, j);
      ctx.dev.copy(at(recv, r.begin + s.begin, es), at(ctx.shm.slot(j, p), s.begin, es), s.count * es);
    }
  }
}

void allreduce_rs_ag(Context& ctx, const CollArgs& a) {
  rs_ag_rounds(ctx, a.send, a.recv, a.count, a.dtype, a.op, -1);
}

}  // namespace smddp::algorithms
