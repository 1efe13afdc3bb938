// What the rest of smddp sees of CUDA: factories behind plain C++ types, so no file outside
// src/device and src/reduce includes a CUDA header (docs/gpu.md). Built with CUDA
// (SMDDP_WITH_CUDA) these run on the GPU (cuda/); built without, cuda_usable() says so and the
// others throw (cuda/cuda_unavailable.cc), so callers need no #ifdef.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "device/device.h"
#include "device/peer_window.h"

namespace smddp::device {

// True when this process can use a CUDA device; otherwise false with the reason in *why (built
// without CUDA, no driver, no device). Initialises CUDA in this process: a process that forks
// ranks afterwards must ask in a child (tests/gpu does).
bool cuda_usable(std::string* why);
int cuda_device_count();

// A Device on CUDA device `ordinal` with a stream of its own (non-blocking). Copies go by
// cudaMemcpyAsync on that stream (copy engines, any direction), reductions by the kernels of
// src/reduce/reduce_cuda.cu on it, launched with at most SMDDP_CUDA_SMS blocks so a collective
// occupies at most that many SMs; fence() waits for the stream. Operands a kernel cannot reach
// (pageable host memory never registered) are reduced on the CPU after the stream drains:
// correct, and slow; the communicator registers what it owns (its staging slots, host copies)
// with cuda_register_host to avoid it.
std::unique_ptr<Device> cuda_device(int ordinal);

// Peer windows over CUDA IPC for device memory of the node's other processes, read by the
// copy engines on `dev`'s stream (dev: made by cuda_device). docs/gpu.md has the protocol.
std::unique_ptr<PeerWindows> cuda_ipc_windows(Device& dev);
// How many peer allocations `windows` (made by cuda_ipc_windows) has opened with
// cudaIpcOpenMemHandle so far: the handle cache's test, which a mapped address alone cannot be
// (the driver hands out the same address to a second open of one handle).
size_t cuda_ipc_opens(const PeerWindows& windows);

// Stream order with the caller (Memory::stream): cuda_event_after records an event on `stream`
// (a cudaStream_t of GPU `device`) on the calling thread, so it marks the work queued there so
// far; cuda_wait makes `dev`'s stream wait for it without blocking the host. The event is
// destroyed with the last owner.
std::shared_ptr<void> cuda_event_after(void* stream, int device);
void cuda_wait(Device& dev, const void* event);
// The cudaStream_t of a Device made by cuda_device (tests and benchmarks play the caller with it).
void* cuda_stream(Device& dev);

// Tests on machines without a GPU: while a stand-in is set, cuda_usable() is true,
// cuda_device_count() is 1 and cuda_device() returns the stand-in's Device, whose "device memory"
// the host and the network cannot read (tests/collective/far_device.h: what CUDA memory is to a
// provider without FI_HMEM). Nothing else of CUDA is stood in for (no IPC, no streams): it serves
// the paths that touch device memory only through the Device, such as host staging across nodes
// (cuda_register_host then declines: CUDA is never started).
using CudaStandIn = std::function<std::unique_ptr<Device>(int ordinal)>;
void set_cuda_stand_in(CudaStandIn make);  // empty: CUDA itself again
const CudaStandIn& cuda_stand_in();

// Device memory for buffers the communicator owns and for tests (cudaMalloc on the current
// device; freed by cuda_free).
void* cuda_malloc(size_t bytes);
void cuda_free(void* p);

// Page-locks host memory (shared-memory segments, scratch) so kernels read it in place and
// copies skip the driver's staging; false when CUDA refused (then the slow path still works).
bool cuda_register_host(void* p, size_t bytes);
void cuda_unregister_host(void* p);

}  // namespace smddp::device
