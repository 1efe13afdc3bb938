// Shared by the files of src/device/cuda: error checks that throw smddp's exceptions, and the
// device type the IPC windows need to reach (its stream). Never included outside src/device.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "device/device.h"
#include "smddp/errors.h"

namespace smddp::device::cuda {

// Throws SystemError "smddp: cuda: <what> failed: <CUDA's message>" unless `e` is success, and
// clears CUDA's sticky last error so the next call does not report this one again.
inline void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw SystemError(std::string("smddp: cuda: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")");
}

// Makes GPU `ordinal` current on the calling thread. Collectives run on the engine thread or,
// inline, on the caller's, whose current GPU may be another; kernels, IPC opens and copies on a
// stream need the stream's GPU current.
inline void make_current(int ordinal) {
  int cur = -1;
  check(cudaGetDevice(&cur), "cudaGetDevice");
  if (cur != ordinal) check(cudaSetDevice(ordinal), "cudaSetDevice");
}

class StreamDevice : public Device {
 public:
  virtual cudaStream_t stream() const = 0;
  virtual int ordinal() const = 0;
};

}  // namespace smddp::device::cuda
