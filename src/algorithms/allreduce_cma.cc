// Single-copy allreduce: reduce-scatter then allgather reading the peers' buffers directly with
// process_vm_readv (cross-memory attach) instead of staging through shared memory.
//
//   round 0: every rank publishes the addresses of its send and recv buffers
//   per chunk of my segment: read that chunk of every peer's input into scratch, reduce it with
//            my own input, in rank order, into my output
//   sync:    every segment is reduced
//   every rank reads every other segment straight from its owner's output into its own
//   sync:    nobody may return (and reuse its buffers) while others still read them
//
// Per byte of message a rank moves about 3.5 bytes of memory at w=2 (4 through the slots), at
// the price of a system call per piece. Each segment is reduced by one rank, in rank order, so
// all ranks get the same bits. Needs ptrace permission between the ranks (same user; the shm
// group sets PR_SET_PTRACER for Yama).
#include <vector>

#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void allreduce_cma(Context& ctx, const CollArgs& a) {
  const int w = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(a.dtype);
  // Scratch for w-1 peer pieces of one chunk, bounded like the staging slots.
  const size_t chunk = std::max<size_t>(1, ctx.shm.slot_bytes() / es);
  {
    const int p = ctx.shm.begin_round();
    ctx.shm.words(me, p)[0] = reinterpret_cast<uint64_t>(a.send);
    ctx.shm.words(me, p)[1] = reinterpret_cast<uint64_t>(a.recv);
    ctx.shm.arrive();
    ctx.shm.wait_all(ctx.op);
    std::vector<const std::byte*> send_of(static_cast<size_t>(w)), recv_of(static_cast<size_t>(w));
    for (int j = 0; j < w; ++j) {
      send_of[static_cast<size_t>(j)] = reinterpret_cast<const std::byte*>(ctx.shm.words(j, p)[0]);
      recv_of[static_cast<size_t>(j)] = reinterpret_cast<const std::byte*>(ctx.shm.words(j, p)[1]);
    }
    std::vector<std::byte> scratch(chunk * es * static_cast<size_t>(w > 1 ? w - 1 : 1));
    std::vector<const void*> srcs(static_cast<size_t>(w));
    const auto seg = patterns::block(a.count, w, me);
    for (size_t c = 0; c < patterns::num_chunks(seg.count, chunk); ++c) {
      const auto r = patterns::chunk_at(seg.count, chunk, c);
      const size_t off = (seg.begin + r.begin) * es;
      size_t k = 0;
      for (int j = 0; j < w; ++j) {
        if (j == me) {
          srcs[static_cast<size_t>(j)] = static_cast<const std::byte*>(a.send) + off;
          continue;
        }
        std::byte* dst = scratch.data() + k++ * chunk * es;
        ctx.shm.read_peer(j, dst, send_of[static_cast<size_t>(j)] + off, r.count * es, ctx.op);
        srcs[static_cast<size_t>(j)] = dst;
      }
      ctx.dev.reduce({static_cast<std::byte*>(a.recv) + off, srcs.data(), w, r.count, a.dtype, a.op, w});
    }
    ctx.shm.begin_round();
    ctx.shm.arrive();
    ctx.shm.wait_all(ctx.op);
    for (int j = 0; j < w; ++j) {
      if (j == me) continue;
      const auto s = patterns::block(a.count, w, j);
      ctx.shm.read_peer(j, static_cast<std::byte*>(a.recv) + s.begin * es, recv_of[static_cast<size_t>(j)] + s.begin * es,
                        s.count * es, ctx.op);
    }
    ctx.shm.begin_round();
    ctx.shm.arrive();
    ctx.shm.wait_all(ctx.op);
  }
}

}  // namespace smddp::algorithms
