// The backend's CUDA side: what a CUDA tensor is to the smddp core, and running the backend's
// own tensor work (copies back into non-contiguous outputs, unflattening) on the tensor's GPU.
// cuda_glue.cc is compiled only against a PyTorch built with CUDA (SMDDP_TORCH_CUDA); the CPU
// torch of Debian cannot make CUDA tensors, so there these are never reached and
// tensor_args.cc says why instead.
//
// Stream contract (docs/gpu.md): a collective on a CUDA tensor is ordered after the work queued
// so far on the caller's *current* stream of that GPU (the core records an event there and its
// communication stream waits on it; the host is not blocked at the call). The Work completes
// once the results have landed in the tensors (its future carries the device, as DDP's comm
// hooks need); wait() therefore blocks the host until then, which is stricter than NCCL's
// stream-only wait and never weaker. The backend's own GPU work (copies back, the future's
// completion events) runs on a stream of smddp's per GPU, never on a stream that holds the
// caller's work: the thread completing a collective has torch's default stream current (the
// rest of a backward pass), and torch's pool streams are handed to users too (FSDP's).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <vector>

#include "smddp/types.h"

namespace smddp::torch_backend {

// Memory::cuda(device, current stream of that device).
Memory cuda_memory(const at::Tensor& t);

// Runs `f` with `device` current, on smddp's stream of that GPU, and returns once the work it
// queued there has finished (also when `f` throws): completion must mean landed, since the
// caller's stream is not ordered after it.
void run_on_cuda_device(int device, const std::function<void()>& f);

// Runs `f` with smddp's stream current on each of `devices`: a future completed in `f` records
// its CUDA events there, after nothing but the backend's own (landed) copies, so that whoever
// waits on the future (`fut.wait()`, a `then` callback: DDP's comm hooks) waits for the
// collective alone, not for what the completing thread's current stream holds.
void on_smddp_streams(const std::vector<c10::Device>& devices, const std::function<void()>& f);

// barrier() orders GPU work as NCCL's does (its barrier is an allreduce queued on the current
// stream, whose wait synchronises that stream): before a rank enters the host barrier, its
// current stream on its GPU drains, so that on return the work every rank queued there before
// the call is done (timing code and checkpointing read results after a barrier). Its GPU:
// `device_ids` (barrier(device_ids=...)), else `bound` (init_process_group(device_id=...)),
// else every GPU whose tensors smddp's collectives took in this process (ProcessGroupNCCL's
// used devices). A GPU without a CUDA context has nothing queued and is skipped, so a CPU job
// with a CUDA torch neither starts the driver nor makes a context here.
void drain_streams_before_barrier(const std::vector<int64_t>& device_ids, const std::optional<c10::Device>& bound);

}  // namespace smddp::torch_backend
