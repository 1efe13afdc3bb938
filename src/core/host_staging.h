// CUDA memory in a communicator that spans nodes, over a network that cannot read device memory
// (libfabric without FI_HMEM: tcp, and every provider until registration of device memory is
// built): the collective runs on page-locked host copies of its buffers. The device copies the
// inputs out (its copy engines, ordered after the caller's stream), the host algorithm runs on
// the copies exactly as for host tensors, and the device copies the outputs back; on a failure
// nothing is copied back, so the caller's outputs stay untouched. Correct for every collective,
// at the cost of one copy of each buffer each way that does not overlap the network
// (docs/gpu.md). Nothing here knows CUDA: the copies are the Device's.
#pragma once

#include <cstddef>
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

}  // namespace smddp::detail
