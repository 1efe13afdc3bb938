// Broadcast through shared memory: per chunk, the root stages, one sync, the others copy out.
#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void broadcast_direct(Context& ctx, const CollArgs& a) {
  const size_t es = dtype_size(a.dtype), chunk = slot_elems(ctx, a.dtype);
  for (size_t c = 0; c < patterns::num_chunks(a.count, chunk); ++c) {
    const auto r = patterns::chunk_at(a.count, chunk, c);
    const int p = ctx.shm.begin_round();
    if (ctx.rank() == a.root) ctx.dev.copy(ctx.shm.slot(a.root, p), at(a.recv, r.begin, es), r.count * es);
    ctx.arrive();
    ctx.wait_all();
    if (ctx.rank() != a.root) ctx.dev.copy(at(a.recv, r.begin, es), ctx.shm.slot(a.root, p), r.count * es);
  }
}

}  // namespace smddp::algorithms
