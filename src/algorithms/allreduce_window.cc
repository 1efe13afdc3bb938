// Single-copy allreduce over peer windows (device/peer_window.h): reduce-scatter then allgather,
// reading the peers' buffers directly instead of staging them through shared memory.
//
//   round:  every rank exposes its send and recv buffers and opens every peer's
//   per chunk of my segment: view that chunk of every peer's input (in place where the window
//           maps peer memory, else read into scratch), reduce it with my own input, in rank
//           order, into my output; where the window writes (CMA), write the reduced chunk
//           straight into every peer's output as well
//   round:  every segment is reduced (only where the window cannot write: every rank then
//           fetches every other segment straight from its owner's output into its own)
//   round:  nobody leaves (and reuses its buffers) while others still read or write them
//
// Why writing is safe, also in place: the chunk of a peer's output a rank writes is its own
// segment there, which only this rank reads (that peer's input, where output is input), and it
// has read it before. Writing saves the middle round, which costs most when a rank waits for a
// peer another process displaced from its core, and sends each reduced chunk on while it is in
// this core's cache: at w=2 through torch, 1 MiB took 113-120 us pushed against 128-130 fetched
// (docs/algorithms.md).
//
// On host memory (CMA) a rank moves about 3.5 bytes of memory per byte of message at w=2 (4
// through the slots), at the price of a system call per piece; on mapped device memory the
// reduction reads the peers in place. Each segment is reduced by one rank, in rank order, so all
// ranks get the same bits. Memory a window cannot expose: the staged rs_ag instead.
#include "algorithms/window_rounds.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void allreduce_rs_ag(Context& ctx, const CollArgs& a);

void allreduce_window(Context& ctx, const CollArgs& a) {
  const int w = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  OpenWindows peers;  // [j][0]: rank j's input, [j][1]: its output
  if (!open_windows(ctx, {{a.send, bytes}, {a.recv, bytes}}, peers)) return allreduce_rs_ag(ctx, a);
  const size_t chunk = window_piece_elems(ctx, es);
  std::byte* scratch = window_scratch(ctx, chunk, es);
  // A writable window (CMA) writes its peers' host memory; CUDA IPC windows only read.
  const bool push = ctx.windows->writable();
  std::vector<const void*> srcs(static_cast<size_t>(w));
  const auto seg = patterns::block(a.count, w, me);
  for (size_t c = 0; c < patterns::num_chunks(seg.count, chunk); ++c) {
    const auto r = patterns::chunk_at(seg.count, chunk, c);
    const size_t off = (seg.begin + r.begin) * es;
    size_t k = 0;
    for (int j = 0; j < w; ++j)
      srcs[static_cast<size_t>(j)] = j == me ? static_cast<const std::byte*>(a.send) + off
                                             : view_peer(ctx, peers[static_cast<size_t>(j)][0], off, r.count * es,
                                                         scratch + k++ * chunk * es);
    std::byte* reduced = static_cast<std::byte*>(a.recv) + off;
    ctx.dev.reduce({reduced, srcs.data(), w, r.count, a.dtype, a.op, w});
    if (push)
      for (int j = 0; j < w; ++j)
        if (j != me) ctx.windows->write(peers[static_cast<size_t>(j)][1], off, reduced, r.count * es, ctx.op);
  }
  if (push) return close_windows(ctx);  // every peer's output written
  close_windows(ctx);  // every segment reduced
  for (int j = 0; j < w; ++j) {
    if (j == me) continue;
    const auto s = patterns::block(a.count, w, j);
    fetch_peer(ctx, peers[static_cast<size_t>(j)][1], s.begin * es, at(a.recv, s.begin, es), s.count * es);
  }
  close_windows(ctx);
}

}  // namespace smddp::algorithms
