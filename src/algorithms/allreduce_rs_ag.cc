// Bandwidth-optimal allreduce: reduce-scatter then allgather, pipelined chunk by chunk through
// the staging slots, one synchronisation per chunk.
//
// Chunk c goes through three steps, each in its own round:
//   stage     every rank copies the segments of chunk c that *other* ranks own (never its own)
//             into its slot;
//   reduce    rank r reduces segment r: its own input straight from the user buffer plus the
//             staged copies of every other rank, in rank order, into its output and into
//             segment r of its own slot;
//   copy out  every rank copies the other reduced segments into its output.
// Round k stages chunk k, reduces chunk k-1 and copies out chunk k-2, so n chunks take n + 1
// rounds (the last copy-out follows the last round) where doing the steps one after another
// took 2n. Every round writes only the slots of its own parity and reads only those of the
// previous round's, as the double buffering requires: a slot written in round k is read in
// round k+1 and written again in round k+2. Within a slot, segment j always sits at the same
// offset (j x chunk/size elements) whatever the chunk's length, so a rank's reduced segment of
// chunk k-1 and its staged segments of chunk k, written in the same round, never overlap.
//
// With slots in L parts (SMDDP_SHM_AHEAD = L - 1) the three steps of a chunk move L rounds apart
// and a rank waits only for its peers to finish round k - L before round k: it runs up to L - 1
// rounds ahead of a peer another process displaced from its core (docs/algorithms.md).
//
// Each rank reduces 1/size of the data, so the arithmetic is spread evenly; each segment is
// reduced by exactly one rank, so all ranks get the same bits. Per rank and byte of message this
// moves (w-1)/w in and out of the slots plus one reduction pass: about 4 bytes of memory traffic
// per byte for w=2, against 5.5 when every rank stages its whole input.
#include <algorithm>
#include <vector>

#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {
void rs_ag_rounds(Context& ctx, const void* send, void* recv, size_t count, DataType t, Reduction op,
                  int out_root) {
  const int w = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(t);
  // L: chunk c is staged in round c, reduced in round c + L and copied out in round c + 2L, so
  // a rank may start round k once its peers finished round k - L: up to L - 1 rounds ahead of
  // the slowest. Round k uses part (k / 2) mod L of its parity's slots, so a part written in
  // round k is written again in round k + 2L, after the wait before that round proved every
  // peer had finished round k + L, its last to read it. A message of fewer than 4L chunks runs
  // in lock-step (L = 1), where the pipeline's fill and drain would outweigh the slack.
  const size_t region = slot_elems(ctx, t, w), chunk = region * static_cast<size_t>(w);
  const size_t n = patterns::num_chunks(count, chunk);
  const size_t L = n >= 4 * static_cast<size_t>(ctx.shm.slot_parts()) ? static_cast<size_t>(ctx.shm.slot_parts()) : 1;
  const bool i_output = out_root < 0 || out_root == me;
  std::vector<const void*> srcs(static_cast<size_t>(w));
  int p0 = 0;  // parity of round 0
  // Segment j of rank r's slot part of round k.
  auto in_slot = [&](int r, size_t k, int j) {
    const int parity = n == 1 ? p0 : p0 ^ static_cast<int>(k & 1);
    return at(ctx.shm.slot(r, parity, static_cast<int>((k / 2) % L)), static_cast<size_t>(j) * region, es);
  };

  // Copies every reduced segment of chunk c but mine from its owner's slot part of round `k`.
  auto copy_out = [&](size_t c, size_t k) {
    if (!i_output) return;
    const auto r = patterns::chunk_at(count, chunk, c);
    for (int j = 0; j < w; ++j) {
      if (j == me) continue;
      const auto s = patterns::block(r.count, w, j);
      ctx.dev.copy(at(recv, r.begin + s.begin, es), in_slot(j, k, j), s.count * es);
    }
  };

  const size_t lag = L;
  // L = 1 copies the last chunk out after the last round (below); L > 1 in rounds of their own.
  const size_t rounds = n == 0 ? 0 : L == 1 ? n + 1 : n + 2 * lag;
  for (size_t k = 0; k < rounds; ++k) {
    // One chunk has nothing to overlap: its reduce round stays in the staging round's parity
    // (segment `me` of a slot is never staged, so the reduced segment fits beside the staged
    // ones), and the collective touches one parity's slots, not two. Measured
    // (docs/performance.md): with a second parity a 256 KiB message took 2-3x as long.
    if (k == 0) p0 = ctx.shm.begin_round();
    else if (n > 1) ctx.shm.begin_round();
    if (k < n) {  // stage chunk k
      const auto r = patterns::chunk_at(count, chunk, k);
      for (int j = 0; j < w; ++j) {
        if (j == me) continue;
        const auto s = patterns::block(r.count, w, j);
        ctx.dev.copy(in_slot(me, k, j), at(send, r.begin + s.begin, es), s.count * es);
      }
    }
    if (k >= lag && k - lag < n) {  // reduce my segment of chunk k-L
      const auto r = patterns::chunk_at(count, chunk, k - lag);
      const auto seg = patterns::block(r.count, w, me);
      for (int j = 0; j < w; ++j)
        srcs[static_cast<size_t>(j)] = j == me ? at(send, r.begin + seg.begin, es) : in_slot(j, k - lag, me);
      void* mine = in_slot(me, k, me);
      ctx.dev.reduce({mine, srcs.data(), w, seg.count, t, op, w});
      if (i_output) ctx.dev.copy(at(recv, r.begin + seg.begin, es), mine, seg.count * es);
    }
    if (k >= 2 * lag && k - 2 * lag < n) copy_out(k - 2 * lag, k - lag);
    ctx.arrive();
    // Round k+1 needs the peers to have finished round k+1-L; the first and last waits are full.
    ctx.wait_all(k + 1 == rounds ? 0 : static_cast<int>(std::min(lag - 1, k)));
  }
  // Lock-step only (L > 1 copied every chunk out in the rounds above, before the last, full
  // wait): the last chunk's reduced segments, written in the last round. The next collective
  // writes this parity only in its second round, after a wait that needs this rank to have arrived.
  if (n > 0 && L == 1) copy_out(n - 1, n == 1 ? 0 : n);
}

void allreduce_rs_ag(Context& ctx, const CollArgs& a) {
  rs_ag_rounds(ctx, a.send, a.recv, a.count, a.dtype, a.op, -1);
}

}  // namespace smddp::algorithms
