// Allgather through shared memory: per chunk, every rank stages its block, one sync, every rank
// copies every staged block to its place. Each byte crosses memory twice (in, out), the
// minimum for a staging design.
#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void allgather_direct(Context& ctx, const CollArgs& a) {
  const size_t es = dtype_size(a.dtype), chunk = slot_elems(ctx, a.dtype);
  const int w = ctx.size(), me = ctx.rank();
  for (size_t c = 0; c < patterns::num_chunks(a.count, chunk); ++c) {
    const auto r = patterns::chunk_at(a.count, chunk, c);
    const int p = ctx.shm.begin_round();
    ctx.dev.copy(ctx.shm.slot(me, p), at(a.send, r.begin, es), r.count * es);
    ctx.arrive();
    ctx.wait_all();
    for (int j = 0; j < w; ++j) {
      void* dst = at(a.recv, static_cast<size_t>(j) * a.count + r.begin, es);
      // Own block: straight from the input (a no-op when in place).
      const void* src = j == me ? at(a.send, r.begin, es) : static_cast<const void*>(ctx.shm.slot(j, p));
      ctx.dev.copy(dst, src, r.count * es);
    }
  }
}

}  // namespace smddp::algorithms
