// Single-copy allgather over peer windows (device/peer_window.h): every rank exposes its input
// block and fetches every peer's straight into its output. One round to open, one to close,
// whatever the size; each byte crosses memory once (the staged `direct` moves it twice). On GPUs
// this is the copy-engine allgather: no kernel, no SM.
#include "algorithms/window_rounds.h"

namespace smddp::algorithms {

void allgather_direct(Context& ctx, const CollArgs& a);

void allgather_window(Context& ctx, const CollArgs& a) {
  const int w = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  OpenWindows peers;  // [j][0]: rank j's input block
  if (!open_windows(ctx, {{a.send, bytes}}, peers)) return allgather_direct(ctx, a);
  // Peers in rotated order (me+1, me+2, ...) so that not every rank reads rank 0 first.
  for (int i = 1; i < w; ++i) {
    const int j = (me + i) % w;
    fetch_peer(ctx, peers[static_cast<size_t>(j)][0], 0, at(a.recv, static_cast<size_t>(j) * a.count, es), bytes);
  }
  ctx.dev.copy(at(a.recv, static_cast<size_t>(me) * a.count, es), a.send, bytes);  // no-op in place
  close_windows(ctx);
}

}  // namespace smddp::algorithms
