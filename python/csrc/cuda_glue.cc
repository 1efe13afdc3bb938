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
  const auto d = static_cast<c10::DeviceIndex>(device);
  c10::cuda::CUDAGuard guard(d);
  // A stream of torch's pool, not this thread's current one: that is the legacy default stream,
  // which waits for everything queued on the default stream (the rest of a backward pass) and
  // would hold the copies, and so this collective's completion and every later one's, behind
  // it. The collective's results have landed (its stream was synchronised), so the copies need
  // no order with any other stream.
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d);
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

}  // namespace smddp::torch_backend
