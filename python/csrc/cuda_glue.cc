// See cuda_glue.h. Built only with SMDDP_TORCH_CUDA (python/CMakeLists.txt; CI compiles it with
// -fsyntax-only against both Debian suites' c10/cuda headers).
#include "cuda_glue.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <atomic>
#include <mutex>

namespace smddp::torch_backend {

namespace {
// smddp's stream of a GPU, made on first use and kept for the process's life, as torch keeps
// its pool's (destroying it at exit would race the CUDA runtime's own teardown). Non-blocking:
// it never waits for torch's legacy default stream.
c10::cuda::CUDAStream smddp_stream(c10::DeviceIndex d) {
  static std::mutex mu;
  static std::array<cudaStream_t, C10_COMPILE_TIME_MAX_GPUS> streams{};
  TORCH_CHECK(d >= 0 && d < C10_COMPILE_TIME_MAX_GPUS, "smddp: CUDA device index ", static_cast<int>(d), " out of range");
  std::lock_guard<std::mutex> g(mu);
  cudaStream_t& s = streams[static_cast<size_t>(d)];
  if (s == nullptr) {
    c10::cuda::CUDAGuard guard(d);
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  return c10::cuda::getStreamFromExternal(s, d);
}

// The GPUs whose tensors this process's smddp collectives have taken (cuda_memory), for the
// barrier, as ProcessGroupNCCL keeps its usedDeviceIdxs_: the current device says nothing (a
// rank may use cuda:N without set_device), and asking for it would start the CUDA driver in a
// job that never used CUDA.
std::array<std::atomic<bool>, C10_COMPILE_TIME_MAX_GPUS> used_gpus{};
}  // namespace

Memory cuda_memory(const at::Tensor& t) {
  const c10::DeviceIndex d = t.device().index();
  cudaStream_t s = c10::cuda::getCurrentCUDAStream(d).stream();
  // torch's default stream is the legacy default stream, whose handle is null; to smddp a null
  // stream means "the inputs are ready", so name it explicitly: the collective must still wait
  // for what the caller queued there (our stream is non-blocking, so it would not otherwise).
  if (s == nullptr) s = cudaStreamLegacy;
  if (d >= 0 && d < C10_COMPILE_TIME_MAX_GPUS) used_gpus[static_cast<size_t>(d)].store(true, std::memory_order_relaxed);
  return Memory::cuda(d, static_cast<void*>(s));
}

void run_on_cuda_device(int device, const std::function<void()>& f) {
  const auto d = static_cast<c10::DeviceIndex>(device);
  c10::cuda::CUDAGuard guard(d);
  // smddp's stream, not this thread's current one: that is the legacy default stream, which
  // waits for everything queued on the default stream (the rest of a backward pass) and would
  // hold the copies, and so this collective's completion and every later one's, behind it; nor
  // one of torch's pool, which round-robins its streams among all takers (FSDP's copy streams
  // among them). The collective's results have landed (its stream was synchronised), so the
  // copies need no order with any other stream.
  const c10::cuda::CUDAStream stream = smddp_stream(d);
  c10::cuda::CUDAStreamGuard on(stream);
  try {
    f();
  } catch (...) {
    // Copies queued before the failure still read buffers the caller frees next: let them land.
    try {
      stream.synchronize();
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  stream.synchronize();
}

void on_smddp_streams(const std::vector<c10::Device>& devices, const std::function<void()>& f) {
  std::vector<c10::cuda::CUDAStream> streams;
  streams.reserve(devices.size());
  for (const c10::Device& d : devices) streams.push_back(smddp_stream(d.index()));
  c10::cuda::CUDAMultiStreamGuard on(streams);
  f();
}

void drain_streams_before_barrier(const std::vector<int64_t>& device_ids, const std::optional<c10::Device>& bound) {
  std::vector<c10::DeviceIndex> gpus;
  for (int64_t id : device_ids) {
    TORCH_CHECK(id >= 0 && id < C10_COMPILE_TIME_MAX_GPUS, "smddp: barrier: device_ids holds ", id,
                ", not a CUDA device index");
    gpus.push_back(static_cast<c10::DeviceIndex>(id));
  }
  if (gpus.empty() && bound && bound->is_cuda() && bound->has_index()) gpus.push_back(bound->index());
  if (gpus.empty())
    for (size_t d = 0; d < used_gpus.size(); ++d)
      if (used_gpus[d].load(std::memory_order_relaxed)) gpus.push_back(static_cast<c10::DeviceIndex>(d));
  for (c10::DeviceIndex d : gpus) {
    // No context on it: nothing was queued there, and making one (the guard's cudaSetDevice)
    // would cost the GPU's memory and startup for nothing.
    if (!c10::cuda::hasPrimaryContext(d)) continue;
    c10::cuda::getCurrentCUDAStream(d).synchronize();  // (on its GPU: CUDAStream sets it)
  }
}

}  // namespace smddp::torch_backend
