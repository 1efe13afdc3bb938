// Single-copy reduce-scatter over peer windows (device/peer_window.h): every rank exposes its
// input (one block per destination) and reduces its own block from every peer's input, chunk by
// chunk, in rank order, into its output. Per byte received a rank reads w blocks and writes one;
// nothing is staged. Each block is reduced by one rank in rank order: the same bits as `direct`.
#include "algorithms/window_rounds.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void reduce_scatter_direct(Context& ctx, const CollArgs& a);

void reduce_scatter_window(Context& ctx, const CollArgs& a) {
  const int w = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(a.dtype), block = a.count * es;
  OpenWindows peers;  // [j][0]: rank j's whole input, w blocks
  if (!open_windows(ctx, {{a.send, block * static_cast<size_t>(w)}}, peers)) return reduce_scatter_direct(ctx, a);
  const size_t chunk = window_piece_elems(ctx, es);
  std::byte* scratch = window_scratch(ctx, chunk, es);
  std::vector<const void*> srcs(static_cast<size_t>(w));
  for (size_t c = 0; c < patterns::num_chunks(a.count, chunk); ++c) {
    const auto r = patterns::chunk_at(a.count, chunk, c);
    const size_t off = static_cast<size_t>(me) * block + r.begin * es;
    size_t k = 0;
    for (int j = 0; j < w; ++j)
      srcs[static_cast<size_t>(j)] = j == me ? static_cast<const std::byte*>(a.send) + off
                                             : view_peer(ctx, peers[static_cast<size_t>(j)][0], off, r.count * es,
                                                         scratch + k++ * chunk * es);
    ctx.dev.reduce({at(a.recv, r.begin, es), srcs.data(), w, r.count, a.dtype, a.op, w});
  }
  close_windows(ctx);
}

}  // namespace smddp::algorithms
