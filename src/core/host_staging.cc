#include "core/host_staging.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace smddp::detail {

using algorithms::CollArgs;
using algorithms::CollKind;

namespace {

// Elements of an alltoall(v) buffer: up to the end of its furthest block.
size_t extent(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  size_t end = 0;
  for (size_t i = 0; i < counts.size() && i < displs.size(); ++i)
    if (counts[i] > 0) end = std::max(end, displs[i] + counts[i]);
  return end;
}

}  // namespace

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
      return {extent(a.send_counts, a.send_displs) * es, extent(a.recv_counts, a.recv_displs) * es, true, true};
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

}  // namespace smddp::detail
