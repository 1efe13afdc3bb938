#include "algorithms/window_rounds.h"

#include <string>

#include "smddp/errors.h"

namespace smddp::algorithms {

bool open_windows(Context& ctx, const std::vector<std::pair<const void*, size_t>>& mine, OpenWindows& peers) {
  if (!ctx.windows)
    throw InvalidArgument("smddp: " + ctx.op.describe() + ": a single-copy algorithm was asked for, but this " +
                          "communicator reaches no peer memory directly");
  constexpr size_t kDesc = device::PeerWindows::kDescriptorBytes;
  const int w = ctx.size(), me = ctx.rank();
  const size_t n = mine.size();
  if (n * kDesc > ctx.shm.slot_bytes()) throw InvalidArgument("smddp: too many windows for one staging slot");
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
  return true;
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
