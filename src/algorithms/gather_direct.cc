// Gather to a root: per chunk, every rank stages its block, one sync, the root copies all out.
#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void gather_direct(Context& ctx, const CollArgs& a) {
  const size_t es = dtype_size(a.dtype), chunk = slot_elems(ctx, a.dtype);
  const int w = ctx.size(), me = ctx.rank();
  for (size_t c = 0; c < patterns::num_chunks(a.count, chunk); ++c) {
    const auto r = patterns::chunk_at(a.count, chunk, c);
    const int p = ctx.shm.begin_round();
    if (me != a.root) ctx.dev.copy(ctx.shm.slot(me, p), at(a.send, r.begin, es), r.count * es);
    ctx.arrive();
    ctx.wait_all();
    if (me != a.root) continue;
    for (int j = 0; j < w; ++j) {
      const void* src = j == me ? at(a.send, r.begin, es) : static_cast<const void*>(ctx.shm.slot(j, p));
      ctx.dev.copy(at(a.recv, static_cast<size_t>(j) * a.count + r.begin, es), src, r.count * es);
    }
  }
}

}  // namespace smddp::algorithms
