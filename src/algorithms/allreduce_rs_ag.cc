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
//
// Taking a late rank's round (SMDDP_SHM_STEAL): every step of a round is rank r's copies and
// its one reduction, so any rank of the node can do r's round for it, reading r's input and
// writing r's output through a peer window (cross-memory attach), in the same order and with the
// same kernel: the bits are the same whoever does it. A rank whose wait has lasted a while does
// so for a peer that finished the round before and whose own wait would now be over; the owner
// claims each round before it works (shm::Group::claim_round), so exactly one does it. With more
// busy processes than cores the late rank is most likely not running: its peers then need not
// wait for it to get a core for every round, only for its last copy-out (lock-step) or its
// return. Device memory (CUDA IPC windows only read) never takes rounds.
#include <algorithm>
#include <vector>

#include "algorithms/algorithm.h"
#include "patterns/partition.h"

namespace smddp::algorithms {
namespace {

// Rank `who`'s buffers as the rank doing its round reaches them: directly (its own) or through
// a peer window (a node-mate's, whose round it took).
struct RoundBuffers {
  const void* send = nullptr;
  void* recv = nullptr;
  device::PeerWindows* win = nullptr;  // set: the buffers below, through it
  device::PeerBuffer send_b, recv_b;
  std::byte* scratch = nullptr;  // room for one segment of `who`'s input (its reduction's)
};

}  // namespace

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
  auto outputs = [&](int r) { return out_root < 0 || out_root == r; };
  std::vector<const void*> srcs(static_cast<size_t>(w));
  int p0 = 0;  // parity of round 0 (every rank's: they begin rounds alike)
  // Segment j of rank r's slot part of round k.
  auto in_slot = [&](int r, size_t k, int j) {
    const int parity = n == 1 ? p0 : p0 ^ static_cast<int>(k & 1);
    return at(ctx.shm.slot(r, parity, static_cast<int>((k / 2) % L)), static_cast<size_t>(j) * region, es);
  };
  auto put = [&](const RoundBuffers& b, size_t elem, const void* from, size_t elems) {
    if (b.win) b.win->write(b.recv_b, elem * es, from, elems * es, ctx.op);
    else ctx.dev.copy(at(b.recv, elem, es), from, elems * es);
  };

  // Copies every reduced segment of chunk c but `who`'s from its owner's slot part of round `k`.
  auto copy_out = [&](int who, const RoundBuffers& b, size_t c, size_t k) {
    if (!outputs(who)) return;
    const auto r = patterns::chunk_at(count, chunk, c);
    for (int j = 0; j < w; ++j) {
      if (j == who) continue;
      const auto s = patterns::block(r.count, w, j);
      put(b, r.begin + s.begin, in_slot(j, k, j), s.count);
    }
  };

  const size_t lag = L;
  // L = 1 copies the last chunk out after the last round (below); L > 1 in rounds of their own.
  const size_t rounds = n == 0 ? 0 : L == 1 ? n + 1 : n + 2 * lag;
  // Round k of rank `who`: what it stages, reduces and copies out.
  auto do_round = [&](size_t k, int who, const RoundBuffers& b) {
    if (k < n) {  // stage chunk k
      const auto r = patterns::chunk_at(count, chunk, k);
      for (int j = 0; j < w; ++j) {
        if (j == who) continue;
        const auto s = patterns::block(r.count, w, j);
        const size_t elem = r.begin + s.begin;
        if (b.win) b.win->read(b.send_b, elem * es, in_slot(who, k, j), s.count * es, ctx.op);
        else ctx.dev.copy(in_slot(who, k, j), at(b.send, elem, es), s.count * es);
      }
    }
    if (k >= lag && k - lag < n) {  // reduce the segment of chunk k-L `who` owns
      const auto r = patterns::chunk_at(count, chunk, k - lag);
      const auto seg = patterns::block(r.count, w, who);
      const size_t elem = r.begin + seg.begin;
      const void* own = at(b.send, elem, es);
      if (b.win) {
        b.win->read(b.send_b, elem * es, b.scratch, seg.count * es, ctx.op);
        own = b.scratch;
      }
      for (int j = 0; j < w; ++j) srcs[static_cast<size_t>(j)] = j == who ? own : in_slot(j, k - lag, who);
      void* reduced = in_slot(who, k, who);
      ctx.dev.reduce({reduced, srcs.data(), w, seg.count, t, op, w});
      if (outputs(who)) put(b, elem, reduced, seg.count);
    }
    if (k >= 2 * lag && k - 2 * lag < n) copy_out(who, b, k - 2 * lag, k - lag);
  };
  // The wait after round k: round k+1 needs the peers to have finished round k+1-L; the first
  // and last waits are full.
  auto lag_after = [&](size_t k) { return k + 1 == rounds ? size_t{0} : std::min(lag - 1, k); };

  RoundBuffers mine;
  mine.send = send;
  mine.recv = recv;
  const uint64_t base = ctx.shm.step();
  // Taking the rounds of late node-mates: host memory only (a window that writes), one node.
  std::vector<int8_t> reach(static_cast<size_t>(w), 0);  // per peer: 0 not probed, 1 yes, -1 no
  std::vector<std::byte> scratch;
  device::PeerWindows* win = ctx.windows && ctx.windows->writable() ? ctx.windows : nullptr;
  const bool takes = win && ctx.shm.take_rounds() && rounds > 1 && !ctx.net;
  if (takes) {
    win->expose(send, count * es, ctx.shm.exposed(me, 0));
    win->expose(recv, outputs(me) ? count * es : 0, ctx.shm.exposed(me, 1));
    ctx.shm.mark_exposed();
  }
  auto take_one = [&]() -> bool {
    for (int v = 0; v < w; ++v) {
      if (v == me) continue;
      const int64_t j = ctx.shm.rounds_since(v, base);  // v's next round
      // j >= 1: v arrived from round 0, which published its descriptors (the acquire above).
      if (j < 1 || j >= static_cast<int64_t>(rounds) || !ctx.shm.exposed_for(v, base)) continue;
      // v's own wait before round j would be over: what round j reads is written, and what it
      // writes is read (L rounds of slack, as above).
      const int64_t need = j - static_cast<int64_t>(lag_after(static_cast<size_t>(j) - 1));
      bool ready = true;
      for (int q = 0; q < w && ready; ++q) ready = ctx.shm.rounds_since(q, base) >= need;
      if (!ready) continue;
      int8_t& ok = reach[static_cast<size_t>(v)];
      if (ok == 0) {
        std::string why;
        ok = win->reachable(v, ctx.shm.exposed(v, 0), &why) ? 1 : -1;
      }
      if (ok < 0) continue;
      const uint64_t count_after = base + static_cast<uint64_t>(j) + 1;
      if (!ctx.shm.take_round(v, count_after)) continue;
      try {
        RoundBuffers theirs;
        theirs.win = win;
        theirs.send_b = win->open(v, ctx.shm.exposed(v, 0));
        if (outputs(v)) theirs.recv_b = win->open(v, ctx.shm.exposed(v, 1));
        scratch.resize(region * es);
        theirs.scratch = scratch.data();
        do_round(static_cast<size_t>(j), v, theirs);
        ctx.dev.fence();
      } catch (const std::exception& e) {
        // v waits for this rank to publish its round: tell it (and every rank) why it never comes.
        ctx.shm.abort(std::string("rank ") + std::to_string(ctx.shm.global(me)) + " failed doing rank " +
                      std::to_string(ctx.shm.global(v)) + "'s round: " + e.what());
        throw;
      }
      ctx.shm.publish_taken_round(v, count_after);
      ctx.shm.count_taken_round();
      return true;
    }
    return false;
  };
  struct Helper {
    shm::Group& g;
    ~Helper() { g.set_round_helper({}); }
  } helper{ctx.shm};
  if (takes) ctx.shm.set_round_helper(take_one);

  for (size_t k = 0; k < rounds; ++k) {
    // One chunk has nothing to overlap: its reduce round stays in the staging round's parity
    // (segment `me` of a slot is never staged, so the reduced segment fits beside the staged
    // ones), and the collective touches one parity's slots, not two. Measured
    // (docs/performance.md): with a second parity a 256 KiB message took 2-3x as long.
    if (k == 0) p0 = ctx.shm.begin_round();
    else if (n > 1) ctx.shm.begin_round();
    // Without taking, no node-mate touches this rank's rounds (they look only at ranks that
    // exposed their buffers for this collective): no claim, so no atomic on the round's path.
    if (!takes || ctx.shm.claim_round()) {
      do_round(k, me, mine);
      ctx.arrive();
    } else {
      try {
        ctx.shm.await_taken_round(ctx.op);
      } catch (...) {
        Context::rethrow_published(ctx.publish_failure, std::current_exception());
      }
    }
    ctx.wait_all(static_cast<int>(lag_after(k)));
  }
  // Lock-step only (L > 1 copied every chunk out in the rounds above, before the last, full
  // wait): the last chunk's reduced segments, written in the last round. The next collective
  // writes this parity only in its second round, after a wait that needs this rank to have arrived.
  if (n > 0 && L == 1) copy_out(me, mine, n - 1, n == 1 ? 0 : n);
}

void allreduce_rs_ag(Context& ctx, const CollArgs& a) {
  rs_ag_rounds(ctx, a.send, a.recv, a.count, a.dtype, a.op, -1);
}

}  // namespace smddp::algorithms
