// Bandwidth-optimal allreduce: reduce-scatter then allgather, pipelined chunk by chunk through
// the staging slots.
//
//   per chunk:  every rank stages the segments *other* ranks own (not its own) -> sync ->
//               rank r reduces segment r: its own input straight from the user buffer plus the
//               staged copies of every other rank, in rank order, into its output and into
//               segment r of its own slot -> sync -> every rank copies the other segments out
//
// Each rank reduces 1/size of the data, so the arithmetic is spread evenly; each segment is
// reduced by exactly one rank, so all ranks get the same bits. Per rank and byte of message this
// moves (w-1)/w in and out of the slots plus one reduction pass: about 4 bytes of memory traffic
// per byte for w=2, against 5.5 when every rank stages its whole input.
// Segment r of my slot is free for the result because I never stage my own segment.
#include <vector>

#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void rs_ag_rounds(Context& ctx, const void* send, void* recv, size_t count, DataType t, Reduction op,
                  int out_root) {
  const size_t es = dtype_size(t), chunk = slot_elems(ctx, t);
  const int w = ctx.size(), me = ctx.rank();
  const bool i_output = out_root < 0 || out_root == me;
  std::vector<const void*> srcs(static_cast<size_t>(w));
  for (size_t c = 0; c < patterns::num_chunks(count, chunk); ++c) {
    const auto r = patterns::chunk_at(count, chunk, c);
    const int p = ctx.shm.begin_round();
    for (int j = 0; j < w; ++j) {
      if (j == me) continue;
      const auto s = patterns::block(r.count, w, j);
      ctx.dev.copy(at(ctx.shm.slot(me, p), s.begin, es), at(send, r.begin + s.begin, es), s.count * es);
    }
    ctx.arrive();
    ctx.shm.wait_all(ctx.op);

    const auto seg = patterns::block(r.count, w, me);
    for (int j = 0; j < w; ++j)
      srcs[static_cast<size_t>(j)] = j == me ? at(send, r.begin + seg.begin, es) : at(ctx.shm.slot(j, p), seg.begin, es);
    void* mine = at(ctx.shm.slot(me, p), seg.begin, es);
    ctx.dev.reduce({mine, srcs.data(), w, seg.count, t, op, w});
    if (i_output) ctx.dev.copy(at(recv, r.begin + seg.begin, es), mine, seg.count * es);
    ctx.arrive();
    ctx.shm.wait_all(ctx.op);

    if (!i_output) continue;
    for (int j = 0; j < w; ++j) {
      if (j == me) continue;
      const auto s = patterns::block(r.count, w, j);
      ctx.dev.copy(at(recv, r.begin + s.begin, es), at(ctx.shm.slot(j, p), s.begin, es), s.count * es);
    }
  }
}

void allreduce_rs_ag(Context& ctx, const CollArgs& a) {
  rs_ag_rounds(ctx, a.send, a.recv, a.count, a.dtype, a.op, -1);
}

}  // namespace smddp::algorithms
