#include "algorithms/window_rounds.h"

#include <string>

#include "core/logging.h"
#include "smddp/errors.h"

namespace smddp::algorithms {

namespace {

// The placements (PeerWindows::placement) of every rank's `n` buffers published in round `p`,
// joined: the same string on every rank. "" where every placement is "" (host memory).
std::string placement_key(Context& ctx, int p, size_t n) {
  constexpr size_t kDesc = device::PeerWindows::kDescriptorBytes;
  std::string key;
  bool any = false;
  for (int j = 0; j < ctx.size(); ++j)
    for (size_t k = 0; k < n; ++k) {
      const std::string where = ctx.windows->placement(ctx.shm.slot(j, p) + k * kDesc);
      any = any || !where.empty();
      key += where;
      key += '\n';
    }
  return any ? key : std::string();
}

// The first single-copy collective of a placement key, after this rank opened (or failed to
// open) its peers' buffers published in round `p`: each rank tries every peer's descriptors, and
// one more round makes the verdict every rank's. Asked once per key: the answer is kept in the
// windows.
bool agree_reachable(Context& ctx, int p, size_t n, bool opened, std::string why, const std::string& key) {
  constexpr size_t kDesc = device::PeerWindows::kDescriptorBytes;
  const int w = ctx.size(), me = ctx.rank();
  bool mine = opened;
  for (int j = 0; j < w && mine; ++j)
    for (size_t k = 0; k < n && mine && j != me; ++k)
      mine = ctx.windows->reachable(j, ctx.shm.slot(j, p) + k * kDesc, &why);
  const int q = ctx.shm.begin_round();
  ctx.shm.words(me, q)[0] = mine ? 1 : 0;
  ctx.arrive();
  ctx.wait_all();
  bool all = true;
  for (int j = 0; j < w; ++j) all = all && ctx.shm.words(j, q)[0] == 1;
  ctx.windows->reachable_by_placement[key] = all;
  if (!mine) {  // once per placement this rank could not reach
    SMDDP_LOG(WARN, ctx.op.rank) << "the single-copy algorithms (" << ctx.windows->name() << ") cannot read "
                                 << "other ranks' memory (" << why << "): this communicator stages through shared "
                                 << "memory instead" << (key.empty() ? "" : " for buffers placed as these are");
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
  auto& verdicts = ctx.windows->reachable_by_placement;
  // Host memory: once the ranks found a peer they cannot reach, every later call stages at once,
  // on every rank, without a round.
  if (auto it = verdicts.find(""); it != verdicts.end() && !it->second) return false;
  const int p = ctx.shm.begin_round();
  bool exposed = true;
  for (size_t k = 0; k < n; ++k)
    exposed = ctx.windows->expose(mine[k].first, mine[k].second, ctx.shm.slot(me, p) + k * kDesc) && exposed;
  ctx.shm.words(me, p)[0] = exposed ? 1 : 0;
  ctx.arrive();
  ctx.wait_all();
  for (int j = 0; j < w; ++j)
    if (ctx.shm.words(j, p)[0] != 1) return false;
  std::string key;
  bool probe = false;
  if (ctx.windows->needs_probe()) {
    key = placement_key(ctx, p, n);
    const auto it = verdicts.find(key);
    if (it != verdicts.end() && !it->second) return false;  // every rank found the same verdict
    probe = it == verdicts.end();
  }
  peers.assign(static_cast<size_t>(w), std::vector<device::PeerBuffer>(n));
  // Opening may fail where the probe has yet to run (CUDA IPC between GPUs without peer access):
  // then this rank says so in the probe's round instead of leaving its peers waiting.
  bool opened = true;
  std::string why;
  for (int j = 0; j < w && opened; ++j) {
    if (j == me) continue;
    for (size_t k = 0; k < n && opened; ++k) {
      try {
        peers[static_cast<size_t>(j)][k] = ctx.windows->open(j, ctx.shm.slot(j, p) + k * kDesc);
      } catch (const device::PeerUnreachable& e) {
        if (!probe) throw;
        opened = false;
        why = e.what();
      }
    }
  }
  // After the opens: the peers' descriptors live in this round's slots, which a later round reuses.
  if (!probe) return true;
  return agree_reachable(ctx, p, n, opened, std::move(why), key);
}

void close_windows(Context& ctx) {
  ctx.shm.begin_round();
  ctx.arrive();
  ctx.wait_all();
}

const void* view_peer(Context& ctx, const device::PeerBuffer& b, size_t offset, size_t bytes, std::byte* scratch) {
  if (b.mapped) {
    device::check_within(b, offset, bytes, ctx.op);
    return b.mapped + offset;
  }
  ctx.windows->read(b, offset, scratch, bytes, ctx.op);
  return scratch;
}

void fetch_peer(Context& ctx, const device::PeerBuffer& b, size_t offset, void* dst, size_t bytes) {
  if (b.mapped) {
    device::check_within(b, offset, bytes, ctx.op);
    ctx.dev.copy(dst, b.mapped + offset, bytes);
  } else {
    ctx.windows->read(b, offset, dst, bytes, ctx.op);
  }
}

}  // namespace smddp::algorithms
