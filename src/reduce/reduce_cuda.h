// The CUDA reduction kernels (reduce_cuda.cu): the CPU kernels' contract (reduce.h) on device
// memory, queued on a stream. Included only by src/device/cuda.
#pragma once

#include <cuda_runtime.h>

#include "reduce/reduce.h"

namespace smddp::reduce::cuda {

// Most sources one launch combines (the node's ranks: 8 on a p4d/p5).
inline constexpr int kMaxSources = 16;
// Threads per block; every block grid-strides over the whole range.
inline constexpr int kThreads = 512;

// Queues the reduction of `a` on `stream` with at most `max_blocks` blocks (so on at most that
// many SMs). `vectors`: with 16-byte loads and stores where the operands line up
// (SMDDP_CUDA_VECTOR_REDUCE), else one element per load. Every pointer must be readable by the
// device (device, registered or managed memory). Returns the launch's error; the kernel's own
// errors surface at the next sync.
cudaError_t reduce(const ReduceArgs& a, cudaStream_t stream, int max_blocks, bool vectors);

}  // namespace smddp::reduce::cuda
