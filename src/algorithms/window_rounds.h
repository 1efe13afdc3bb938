// The rounds every single-copy algorithm opens and closes with (device/peer_window.h): each rank
// exposes its buffers and opens every peer's, then reads them directly; at the end no rank
// leaves (and frees or reuses its buffers) before every rank has finished reading.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/scratch_pool.h"
#include "device/peer_window.h"

namespace smddp::algorithms {

// peers[j][k]: buffer k of local rank j (unused for j == my rank).
using OpenWindows = std::vector<std::vector<device::PeerBuffer>>;

// One round: every rank publishes descriptors of `mine` (address, bytes each) and opens every
// peer's. Returns false, on every rank alike, when some rank could not expose its memory this
// way (the caller then runs a staged algorithm instead); `peers` is filled only on true.
bool open_windows(Context& ctx, const std::vector<std::pair<const void*, size_t>>& mine, OpenWindows& peers);

// The closing round: returns once every rank has finished reading every other's buffers.
void close_windows(Context& ctx);

// Bytes [offset, offset + bytes) of a peer's buffer, readable by ctx.dev: in place where the
// window maps the peer's memory, otherwise read into `scratch` (room for `bytes`).
const void* view_peer(Context& ctx, const device::PeerBuffer& b, size_t offset, size_t bytes, std::byte* scratch);

// Copies bytes [offset, offset + bytes) of a peer's buffer into `dst` (one copy either way).
void fetch_peer(Context& ctx, const device::PeerBuffer& b, size_t offset, void* dst, size_t bytes);

// Scratch slot the single-copy algorithms use for pieces read from peers (scratch_pool.h).
inline constexpr size_t kWindowScratchSlot = 4;

// Elements of type size `es` in each piece the window allreduce and reduce_scatter read, reduce
// and write: 256 KiB, or the staging chunk where that is smaller (tests use small slots to make
// several pieces of a small message). Not the staging chunk itself: the window's bands were
// measured with 256 KiB pieces, whose scratch stays in a core's L2 between the read and the
// reduction, and since the chunk grew to 1 MiB (docs/performance.md) the two differ.
inline size_t window_piece_elems(const Context& ctx, size_t es) {
  constexpr size_t kPieceBytes = size_t{256} << 10;
  return std::max<size_t>(1, std::min(ctx.shm.slot_bytes(), kPieceBytes) / es);
}

// Room for one piece (window_piece_elems) from each of the w-1 peers, which view_peer reads into
// where the window does not map them: piece j at j x piece_elems x es.
inline std::byte* window_scratch(Context& ctx, size_t piece_elems, size_t es) {
  const size_t peers = ctx.size() > 1 ? static_cast<size_t>(ctx.size() - 1) : 1;
  return scratch_buffer(ctx, kWindowScratchSlot, piece_elems * es * peers);
}

}  // namespace smddp::algorithms
