// One-shot allreduce (latency-optimal): per chunk, every rank stages its input, one sync, then
// every rank reduces all staged inputs itself, in rank order (so all ranks get the same bits).
// One synchronisation per chunk; each rank reads size x chunk bytes. Best for small messages.
#include <vector>

#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void allreduce_one_shot(Context& ctx, const CollArgs& a) {
  const size_t es = dtype_size(a.dtype), chunk = slot_elems(ctx, a.dtype);
  const int w = ctx.size();
  std::vector<const void*> srcs(static_cast<size_t>(w));
  for (size_t c = 0; c < patterns::num_chunks(a.count, chunk); ++c) {
    const auto r = patterns::chunk_at(a.count, chunk, c);
    const int p = ctx.shm.begin_round();
    ctx.dev.copy(ctx.shm.slot(ctx.rank(), p), at(a.send, r.begin, es), r.count * es);
    ctx.arrive();
    ctx.wait_all();
    for (int j = 0; j < w; ++j) srcs[static_cast<size_t>(j)] = ctx.shm.slot(j, p);
    ctx.dev.reduce({at(a.recv, r.begin, es), srcs.data(), w, r.count, a.dtype, a.op, w});
  }
}

}  // namespace smddp::algorithms
