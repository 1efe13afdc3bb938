// CUDA memory in a communicator that spans nodes, over a network that cannot read device memory
// (libfabric without FI_HMEM: tcp, and every provider until registration of device memory is
// built): the collective runs on page-locked host copies of its buffers. The device copies the
// inputs out (its copy engines, ordered after the caller's stream), the host algorithm runs on
// the copies exactly as for host tensors, and the device copies the outputs back; on a failure
// nothing is copied back, so the caller's outputs stay untouched. Correct for every collective,
// at the cost of one copy of each buffer each way that does not overlap the network
// (docs/gpu.md). Nothing here knows CUDA: the copies are the Device's.
//
// Large allreduce, allgather and reduce_scatter are cut into pieces instead (PipelinedStaging):
// each piece is a collective of its own on host buffers of one piece, and while piece k crosses
// the network the device copies piece k+1 in and piece k-1 out, so the copies hide behind the
// network rather than adding to it, and the host memory held is three pieces, not the buffers.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/scratch_pool.h"
#include "device/device.h"

namespace smddp::detail {

// How a collective on `rank` of `size` uses its two buffers: their extents in bytes, whether it
// reads `send` (a scatter's off the root, a broadcast's off the root: no) and whether it writes
// `recv` (a reduce's or gather's off the root, a broadcast's on the root: no).
struct BufferUse {
  size_t send_bytes = 0, recv_bytes = 0;
  bool reads_send = false, writes_recv = false;
};
BufferUse buffer_use(const algorithms::CollArgs& a, int rank, int size);

class HostStaging {
 public:
  // pool: host buffers kept between collectives (registered with the network and page-locked by
  // its hooks, where they can be).
  explicit HostStaging(algorithms::ScratchPool& pool) : pool_(pool) {}

  // Copies what `a` reads from device memory into host buffers (one buffer for send and recv
  // when they overlap, so in-place calls stay in place) and waits until it landed; returns the
  // same collective on those buffers (memory: host).
  algorithms::CollArgs stage_in(device::Device& dev, const algorithms::CollArgs& a, int rank, int size);
  // After the host collective succeeded: copies its outputs back and waits until they landed.
  void stage_out(device::Device& dev);

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  algorithms::ScratchPool& pool_;
  std::vector<Copy> out_;  // host -> device, for stage_out
};

// How many pieces PipelinedStaging cuts `a` into when every piece holds at most `piece_bytes`
// bytes of all ranks' data (at least one element of each rank's block); 1 (not cut) for the
// other collectives, for piece_bytes 0, and for collectives of at most one piece's data. Every
// rank computes the same number from what the ranks agree on (kind, count, dtype, size), and
// reserves that many collective sequence numbers: each piece's network tags are its own.
size_t staging_pieces(const algorithms::CollArgs& a, int size, size_t piece_bytes);
// The elements of each rank's block in every piece but the last (0: not cut).
size_t staging_piece_elements(const algorithms::CollArgs& a, int size, size_t piece_bytes);

class PipelinedStaging {
 public:
  // `a`: an allreduce, allgather or reduce_scatter on `dev`'s memory that staging_pieces(a, size,
  // piece_bytes) cuts into more than one piece. Host buffers come from slots 0-2 of `pool`, one
  // piece each.
  PipelinedStaging(algorithms::ScratchPool& pool, device::Device& dev, const algorithms::CollArgs& a, int rank,
                   int size, size_t piece_bytes);

  // Calls run(piece, k) for k = 0, 1, ..., each piece the same collective in place on host
  // buffers (memory: host); piece k's outputs are copied back while piece k+1 runs, and all of
  // them have landed when this returns. If run throws, the copies queued meanwhile have landed
  // when the error leaves here, and the pieces before the one that failed
  // may have been copied back: the outputs are then partly written, as a failed collective on
  // host memory leaves them (a disagreement between the ranks is found in the first piece,
  // before anything is written).
  void run(const std::function<void(const algorithms::CollArgs&, size_t)>& run);

 private:
  size_t piece_count(size_t k) const;  // elements of each rank's block in piece k
  std::byte* host(size_t k) const { return bufs_[k % 3]; }
  void copy_in(size_t k);
  void copy_out(size_t k);
  algorithms::CollArgs piece(size_t k) const;

  device::Device& dev_;
  const algorithms::CollArgs a_;  // a copy: the caller's may be a temporary
  int rank_, size_;
  size_t pieces_, per_piece_, es_;
  std::byte* bufs_[3] = {};
};

}  // namespace smddp::detail
