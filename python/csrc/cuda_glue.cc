// See cuda_glue.h. Built only with SMDDP_TORCH_CUDA (python/CMakeLists.txt; CI compiles it with
// -fsyntax-only against both Debian suites' c10/cuda headers).
#include "cuda_glue.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace smddp::torch_backend {

Memory cuda_memory(const at::Tensor& t) {
  const c10::DeviceIndex d = t.device().index();
  cudaStream_t s = c10::cuda::getCurrentCUDAStream(d).stream();
  // torch's default stream is the legacy default stream, whose handle is null; to smddp a null
  // stream means "the inputs are ready", so name it explicitly: the collective must still wait
  // for what the caller queued there (our stream is non-blocking, so it would not otherwise).
  if (s == nullptr) s = cudaStreamLegacy;
  return Memory::cuda(d, static_cast<void*>(s));
}

void run_on_cuda_device(int device, const std::function<void()>& f) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  f();
  c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).synchronize();
}

}  // namespace smddp::torch_backend
