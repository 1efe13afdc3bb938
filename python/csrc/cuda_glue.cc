// See cuda_glue.h. Built only with SMDDP_TORCH_CUDA (python/CMakeLists.txt; CI compiles it with
// -fsyntax-only against both Debian suites' c10/cuda headers).
#include "cuda_glue.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace smddp::torch_backend {

Memory cuda_memory(const at::Tensor& t) {
  const c10::DeviceIndex d = t.device().index();
  return Memory::cuda(d, static_cast<void*>(c10::cuda::getCurrentCUDAStream(d).stream()));
}

void run_on_cuda_device(int device, const std::function<void()>& f) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  f();
  c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).synchronize();
}

}  // namespace smddp::torch_backend
