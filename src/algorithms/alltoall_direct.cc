// All-to-all (equal blocks or per-peer counts) through shared memory. Each slot is cut into
// `size` sub-slots, one per destination; per round every rank stages the next piece of each of
// its outgoing blocks, one sync, then copies the piece addressed to it out of every slot.
// With per-peer counts the number of rounds (longest block / sub-slot) is agreed first in one
// extra round, since no rank knows every other rank's counts.
#include <algorithm>
#include <string>

#include "smddp/errors.h"

#include "algorithms/algorithm.h"
#include "algorithms/scratch_pool.h"
#include "patterns/partition.h"

namespace smddp::algorithms {

void alltoall_direct(Context& ctx, const CollArgs& a) {
  const int w = ctx.size(), me = ctx.rank();
  const size_t es = dtype_size(a.dtype), chunk = slot_elems(ctx, a.dtype, w);
  size_t longest = 0;
  for (int j = 0; j < w; ++j)
    longest = std::max({longest, a.send_counts[static_cast<size_t>(j)], a.recv_counts[static_cast<size_t>(j)]});
  if (!a.uniform) {
    // Every rank publishes its send and receive counts; all ranks check every pair, so a
    // disagreement raises the same error everywhere before any data moves.
    const int p = ctx.shm.begin_round();
    auto* mine = reinterpret_cast<uint64_t*>(ctx.shm.slot(me, p));
    const bool fits = 2 * static_cast<size_t>(w) * sizeof(uint64_t) <= ctx.shm.slot_bytes();
    for (int j = 0; fits && j < w; ++j) {
      mine[j] = a.send_counts[static_cast<size_t>(j)];
      mine[w + j] = a.recv_counts[static_cast<size_t>(j)];
    }
    ctx.shm.words(me, p)[0] = longest;
    ctx.arrive();
    ctx.wait_all();
    for (int j = 0; j < w; ++j) longest = std::max<size_t>(longest, ctx.shm.words(j, p)[0]);
    auto counts_of = [&](int r) { return reinterpret_cast<const uint64_t*>(ctx.shm.slot(r, p)); };
    for (int i = 0; fits && i < w; ++i)
      for (int j = 0; j < w; ++j) {
        const uint64_t sent = counts_of(i)[j], expected = counts_of(j)[w + i];
        if (sent != expected)
          throw MismatchError("smddp: " + ctx.op.describe() + ": ranks disagree on alltoall counts: rank " +
                              std::to_string(i) + " sends " + std::to_string(sent) + " elements to rank " +
                              std::to_string(j) + ", which expects " + std::to_string(expected) +
                              std::string(kNothingWritten));
      }
  }
  // In place with per-peer counts, the blocks coming in are laid out otherwise than those going
  // out: a block written into recv would overwrite bytes still to be sent (this rank's own block,
  // read at the end of each round, and the later pieces of every block). The blocks to send are
  // copied aside first, as across nodes (net_direct.cc). Equal blocks in place stay in place: each
  // round writes exactly the pieces it has just read.
  const void* send = a.send;
  if (a.send == a.recv && !a.uniform) {
    const size_t extent = alltoall_extent(a.send_counts, a.send_displs);
    std::byte* aside = scratch_buffer(ctx, 0, extent * es);
    ctx.dev.copy(aside, a.send, extent * es);
    send = aside;
  }
  for (size_t c = 0; c < patterns::num_chunks(longest, chunk); ++c) {
    const size_t off = c * chunk;
    const int p = ctx.shm.begin_round();
    for (int d = 0; d < w; ++d) {
      const size_t n = a.send_counts[static_cast<size_t>(d)];
      if (d == me || off >= n) continue;
      ctx.dev.copy(at(ctx.shm.slot(me, p), static_cast<size_t>(d) * chunk, es),
                   at(send, a.send_displs[static_cast<size_t>(d)] + off, es), std::min(chunk, n - off) * es);
    }
    ctx.arrive();
    ctx.wait_all();
    for (int j = 0; j < w; ++j) {
      const size_t n = a.recv_counts[static_cast<size_t>(j)];
      if (off >= n) continue;
      const void* src = j == me ? at(send, a.send_displs[static_cast<size_t>(me)] + off, es)
                                : static_cast<const void*>(at(ctx.shm.slot(j, p), static_cast<size_t>(me) * chunk, es));
      ctx.dev.copy(at(a.recv, a.recv_displs[static_cast<size_t>(j)] + off, es), src, std::min(chunk, n - off) * es);
    }
  }
}

}  // namespace smddp::algorithms
