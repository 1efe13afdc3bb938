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
  virtual void reduce(const reduce::ReduceArgs& args) = 0;
  // Returns once every copy and reduction issued so far has landed in memory, so that the other
  // ranks may read it. Host memory: at once (copies and reductions are done when they return).
  // An asynchronous device (CUDA: work queued on a stream) waits for its queue here. Algorithms
  // never call it themselves: Context::arrive() does, before telling the peers.
  virtual void fence() {}
};

// Host memory: host_copy (host_copy.h) and the CPU reduction kernels.
Device& host();

}  // namespace smddp::device
