#include "core/host_staging.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>

namespace smddp::detail {

using algorithms::CollArgs;
using algorithms::CollKind;

BufferUse buffer_use(const CollArgs& a, int rank, int size) {
  const size_t es = dtype_size(a.dtype), one = a.count * es, all = one * static_cast<size_t>(size);
  const bool root = rank == a.root;
  switch (a.kind) {
    case CollKind::allreduce: return {one, one, true, true};
    case CollKind::allgather: return {one, all, true, true};
    case CollKind::reduce_scatter: return {all, one, true, true};
    case CollKind::broadcast: return {one, one, root, !root};  // one buffer: send == recv
    case CollKind::reduce: return {one, one, true, root};
    case CollKind::gather: return {one, all, true, root};
    case CollKind::scatter: return {all, one, root, true};
    case CollKind::alltoall:
      return {algorithms::alltoall_extent(a.send_counts, a.send_displs) * es,
              algorithms::alltoall_extent(a.recv_counts, a.recv_displs) * es, true, true};
    case CollKind::barrier: return {};
  }
  return {};
}

CollArgs HostStaging::stage_in(device::Device& dev, const CollArgs& a, int rank, int size) {
  out_.clear();
  const BufferUse use = buffer_use(a, rank, size);
  const auto s = reinterpret_cast<uintptr_t>(a.send), r = reinterpret_cast<uintptr_t>(a.recv);
  const size_t sb = a.send ? use.send_bytes : 0, rb = a.recv ? use.recv_bytes : 0;
  CollArgs h = a;
  h.memory = Memory{};
  h.ready.reset();
  // Buffers that overlap (in place: send == recv, or one inside the other as torch's in-place
  // allgather and reduce_scatter have them) share one host buffer at the same offsets, so the
  // algorithm sees the aliasing the caller made.
  std::byte *hs = nullptr, *hr = nullptr;
  if (sb > 0 && rb > 0 && s < r + rb && r < s + sb) {
    const uintptr_t lo = std::min(s, r), hi = std::max(s + sb, r + rb);
    std::byte* host = pool_.get(0, hi - lo);
    hs = host + (s - lo);
    hr = host + (r - lo);
  } else {
    if (sb > 0) hs = pool_.get(0, sb);
    if (rb > 0) hr = pool_.get(1, rb);
  }
  if (hs) h.send = hs;
  if (hr) h.recv = hr;
  if (hs && use.reads_send) dev.copy(hs, a.send, sb);
  if (hr && use.writes_recv) {
    if (a.kind == CollKind::alltoall && !a.uniform) {
      // alltoallv's blocks may leave gaps in recv that are the caller's, not the collective's:
      // copy back each block (adjacent ones merged), never the gaps.
      const size_t es = dtype_size(a.dtype);
      std::vector<std::pair<size_t, size_t>> blocks;  // [begin, end) in elements
      for (size_t j = 0; j < a.recv_counts.size() && j < a.recv_displs.size(); ++j)
        if (a.recv_counts[j] > 0) blocks.emplace_back(a.recv_displs[j], a.recv_displs[j] + a.recv_counts[j]);
      std::sort(blocks.begin(), blocks.end());
      for (size_t i = 0; i < blocks.size();) {
        auto [begin, end] = blocks[i];
        for (++i; i < blocks.size() && blocks[i].first <= end; ++i) end = std::max(end, blocks[i].second);
        out_.push_back({static_cast<std::byte*>(a.recv) + begin * es, hr + begin * es, (end - begin) * es});
      }
    } else {
      out_.push_back({a.recv, hr, rb});
    }
  }
  dev.fence();
  return h;
}

void HostStaging::stage_out(device::Device& dev) {
  for (const Copy& c : out_) dev.copy(c.dst, c.src, c.bytes);
  out_.clear();
  dev.fence();
}

namespace {

bool cut_by_pieces(CollKind k) {
  return k == CollKind::allreduce || k == CollKind::allgather || k == CollKind::reduce_scatter;
}
// Ranks' blocks in each piece: allgather's output and reduce_scatter's input hold one per rank.
size_t blocks(CollKind k, int size) { return k == CollKind::allreduce ? 1 : static_cast<size_t>(size); }
// Elements of each rank's block per piece.
size_t per_piece(const CollArgs& a, int size, size_t piece_bytes) {
  return std::max<size_t>(1, piece_bytes / dtype_size(a.dtype) / blocks(a.kind, size));
}

}  // namespace

size_t staging_piece_elements(const CollArgs& a, int size, size_t piece_bytes) {
  if (!cut_by_pieces(a.kind) || !a.uniform || piece_bytes == 0) return 0;
  const size_t e = per_piece(a, size, piece_bytes);
  return a.count > e ? e : 0;
}

size_t staging_pieces(const CollArgs& a, int size, size_t piece_bytes) {
  const size_t e = staging_piece_elements(a, size, piece_bytes);
  return e ? (a.count + e - 1) / e : 1;
}

PipelinedStaging::PipelinedStaging(algorithms::ScratchPool& pool, device::Device& dev, const CollArgs& a, int rank,
                                   int size, size_t piece_bytes)
    : dev_(dev),
      a_(a),
      rank_(rank),
      size_(size),
      pieces_(staging_pieces(a, size, piece_bytes)),
      per_piece_(staging_piece_elements(a, size, piece_bytes)),
      es_(dtype_size(a.dtype)) {
  if (pieces_ < 2) throw std::logic_error("smddp: PipelinedStaging of a collective not cut into pieces");
  const size_t bytes = per_piece_ * es_ * blocks(a.kind, size);
  for (size_t i = 0; i < 3 && i < pieces_; ++i) bufs_[i] = pool.get(i, bytes);
}

size_t PipelinedStaging::piece_count(size_t k) const {
  return std::min(per_piece_, a_.count - k * per_piece_);
}

// Each piece runs in place on one host buffer laid out as the collective of piece_count(k)
// elements a block expects: allreduce's one block, allgather's output and reduce_scatter's
// input with their rank blocks side by side (the device copies gather and scatter the blocks).
CollArgs PipelinedStaging::piece(size_t k) const {
  CollArgs p = a_;
  p.memory = Memory{};
  p.ready.reset();
  p.count = piece_count(k);
  std::byte* h = host(k);
  std::byte* mine = h + static_cast<size_t>(rank_) * p.count * es_;
  switch (a_.kind) {
    case CollKind::allgather: p.send = mine; p.recv = h; break;
    case CollKind::reduce_scatter: p.send = h; p.recv = mine; break;
    default: p.send = h; p.recv = h; break;
  }
  return p;
}

void PipelinedStaging::copy_in(size_t k) {
  const size_t n = piece_count(k), off = k * per_piece_, bytes = n * es_;
  const auto* send = static_cast<const std::byte*>(a_.send);
  std::byte* h = host(k);
  switch (a_.kind) {
    case CollKind::allgather: dev_.copy(h + static_cast<size_t>(rank_) * bytes, send + off * es_, bytes); break;
    case CollKind::reduce_scatter:  // every rank's block of the piece, side by side
      dev_.copy_rows(h, bytes, send + off * es_, a_.count * es_, bytes, static_cast<size_t>(size_));
      break;
    default: dev_.copy(h, send + off * es_, bytes); break;
  }
}

void PipelinedStaging::copy_out(size_t k) {
  const size_t n = piece_count(k), off = k * per_piece_, bytes = n * es_;
  auto* recv = static_cast<std::byte*>(a_.recv);
  const std::byte* h = host(k);
  switch (a_.kind) {
    case CollKind::allgather:  // back to every rank's block
      dev_.copy_rows(recv + off * es_, a_.count * es_, h, bytes, bytes, static_cast<size_t>(size_));
      break;
    case CollKind::reduce_scatter: dev_.copy(recv + off * es_, h + static_cast<size_t>(rank_) * bytes, bytes); break;
    default: dev_.copy(recv + off * es_, h, bytes); break;
  }
}

// Three host buffers in turn: while piece k runs on one, the device copies piece k-1 out of the
// second and piece k+1 into the third; the fence after piece k waits for both, so the buffer
// piece k+2 copies into next is the one piece k-1 left.
void PipelinedStaging::run(const std::function<void(const CollArgs&, size_t)>& run) {
  try {
    copy_in(0);
    dev_.fence();
    for (size_t k = 0; k < pieces_; ++k) {
      if (k + 1 < pieces_) copy_in(k + 1);
      run(piece(k), k);
      dev_.fence();
      copy_out(k);
    }
    dev_.fence();
  } catch (...) {
    // A piece failed with the next piece's copy in and the last one's copy out still queued:
    // they use the pool's buffers and the caller's, so they land before anyone frees either.
    try {
      dev_.fence();
    } catch (...) {  // the device's own failure; the piece's error is the one to report
    }
    throw;
  }
}

}  // namespace smddp::detail
