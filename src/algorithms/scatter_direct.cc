// Scatter from a root: per chunk, the root stages a piece of every block (size sub-slots), one
// sync, every rank copies its piece out.
#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void scatter_direct(Context& ctx, const CollArgs& a) {
  const int w = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(a.dtype), chunk = slot_elems(ctx, a.dtype, w);
  for (size_t c = 0; c < patterns::num_chunks(a.count, chunk); ++c) {
    const auto r = patterns::chunk_at(a.count, chunk, c);
    const int p = ctx.shm.begin_round();
    if (me == a.root)
      for (int b = 0; b < w; ++b)
        if (b != me)
          ctx.dev.copy(at(ctx.shm.slot(me, p), static_cast<size_t>(b) * chunk, es),
                       at(a.send, static_cast<size_t>(b) * a.count + r.begin, es), r.count * es);
    ctx.arrive();
    ctx.wait_all();
    const void* src = me == a.root ? at(a.send, static_cast<size_t>(me) * a.count + r.begin, es)
                                   : static_cast<const void*>(at(ctx.shm.slot(a.root, p), static_cast<size_t>(me) * chunk, es));
    ctx.dev.copy(at(a.recv, r.begin, es), src, r.count * es);
  }
}

}  // namespace smddp::algorithms
