// Memory/execution abstraction. Algorithms move and combine bytes only through a Device, so the
// same algorithm code serves host memory now and device memory later (the CUDA issue).
#pragma once

#include <cstddef>

#include "reduce/reduce.h"

namespace smddp::device {

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // dst and src must not overlap; dst == src is a no-op.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // `rows` copies of `bytes` each, row i from src + i * src_stride to dst + i * dst_stride (rank
  // blocks gathered or scattered): one call where the device has one (CUDA's 2D copy, not a
  // launch per row), else a copy() per row. No row may overlap another's source or destination.
  virtual void copy_rows(void* dst, size_t dst_stride, const void* src, size_t src_stride, size_t bytes,
                         size_t rows) {
    for (size_t i = 0; i < rows; ++i)
      copy(static_cast<std::byte*>(dst) + i * dst_stride, static_cast<const std::byte*>(src) + i * src_stride, bytes);
  }
  virtual void reduce(const reduce::ReduceArgs& args) = 0;
  // Returns once every copy and reduction issued so far has landed in memory, so that the other
  // ranks may read it. Host memory: at once (copies and reductions are done when they return).
  // An asynchronous device (CUDA: work queued on a stream) waits for its queue here. Algorithms
  // never call it themselves: Context::arrive() does, before telling the peers.
  virtual void fence() {}
  // Whether the network may read and write this memory itself. Host memory: yes. Device memory
  // a provider cannot reach (CUDA without FI_HMEM) is staged through host buffers for a
  // collective across nodes (core/host_staging.h); memory the network reaches is handed to it
  // as it is, and NetExchange fences before every post.
  virtual bool network_addressable() const { return false; }
  // Whether the network may read or write `p` itself: all of this device's memory where
  // network_addressable(), else host memory only (the host's staging slots and scratch, which
  // an algorithm on device memory also hands to the network). NetExchange bounces what it may
  // not through host buffers (SMDDP_CUDA_NET_BOUNCE, algorithms/bounce_pool.h).
  virtual bool network_reaches(const void* p) const {
    (void)p;
    return network_addressable();
  }
};

// Host memory: host_copy (host_copy.h) and the CPU reduction kernels.
Device& host();

}  // namespace smddp::device
