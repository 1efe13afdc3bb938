#include "algorithms/window_rounds.h"

#include <string>

#include "core/logging.h"
#include "smddp/errors.h"

namespace smddp::algorithms {

namespace {

// The communicator's first single-copy collective, after the round that published the
// descriptors (parity `p`): each rank tries every peer's first descriptor, and one more round
// makes the verdict every rank's. Asked once: the answer is kept in the windows.
bool agree_reachable(Context& ctx, int p) {
  const int w = ctx.size(), me = ctx.rank();
  std::string why;
  bool mine = true;
  for (int j = 0; j < w && mine; ++j)
    if (j != me) mine = ctx.windows->reachable(j, ctx.shm.slot(j, p), &why);
  const int q = ctx.shm.begin_round();
  ctx.shm.words(me, q)[0] = mine ? 1 : 0;
  ctx.arrive();
  ctx.shm.wait_all(ctx.op);
  bool all = true;
  for (int j = 0; j < w; ++j) all = all && ctx.shm.words(j, q)[0] == 1;
  ctx.windows->reachable_everywhere = all;
  if (!mine) {
    SMDDP_LOG(WARN, ctx.op.rank) << "the single-copy algorithms (" << ctx.windows->name() << ") cannot read "
                                 << "other ranks' memory (" << why << "): this communicator stages through shared "
                                 << "memory instead";
  }
  return all;
}

}  // namespace

bool open_windows(Context& ctx, const std::vector<std::pair<const void*, size_t>>& mine, OpenWindows& peers) {
  if (!ctx.windows)
    throw InvalidArgument("smddp: " + ctx.op.describe() + ": a single-copy algorithm was asked for, but this " +
                          "communicator reaches no peer memory directly");
  constexpr size_t kDesc = device::PeerWindows::kDescriptorBytes;
  const int w = ctx.size(), me = ctx.rank();
  const size_t n = mine.size();
  if (n * kDesc > ctx.shm.slot_bytes()) throw InvalidArgument("smddp: too many windows for one staging slot");
  // Once the ranks found a peer they cannot reach, every later call stages at once, on every rank.
  if (ctx.windows->reachable_everywhere.has_value() && !*ctx.windows->reachable_everywhere) return false;
  const int p = ctx.shm.begin_round();
  bool exposed = true;
  for (size_t k = 0; k < n; ++k)
    exposed = ctx.windows->expose(mine[k].first, mine[k].second, ctx.shm.slot(me, p) + k * kDesc) && exposed;
  ctx.shm.words(me, p)[0] = exposed ? 1 : 0;
  ctx.arrive();
  ctx.shm.wait_all(ctx.op);
  for (int j = 0; j < w; ++j)
    if (ctx.shm.words(j, p)[0] != 1) return false;
  peers.assign(static_cast<size_t>(w), std::vector<device::PeerBuffer>(n));
  for (int j = 0; j < w; ++j) {
    if (j == me) continue;
    for (size_t k = 0; k < n; ++k)
      peers[static_cast<size_t>(j)][k] = ctx.windows->open(j, ctx.shm.slot(j, p) + k * kDesc);
  }
  // After the opens: the peers' descriptors live in this round's slots, which a later round reuses.
  if (!ctx.windows->needs_probe() || ctx.windows->reachable_everywhere.has_value()) return true;  // (not false)
  return agree_reachable(ctx, p);
}

void close_windows(Context& ctx) {
  ctx.shm.begin_round();
  ctx.arrive();
  ctx.shm.wait_all(ctx.op);
}

const void* view_peer(Context& ctx, const device::PeerBuffer& b, size_t offset, size_t bytes, std::byte* scratch) {
  if (b.mapped) return b.mapped + offset;
  ctx.windows->read(b, offset, scratch, bytes, ctx.op);
  return scratch;
}

void fetch_peer(Context& ctx, const device::PeerBuffer& b, size_t offset, void* dst, size_t bytes) {
  if (b.mapped) ctx.dev.copy(dst, b.mapped + offset, bytes);
  else ctx.windows->read(b, offset, dst, bytes, ctx.op);
}

}  // namespace smddp::algorithms
