// Shared by the files of src/device/cuda: error checks that throw smddp's exceptions, and the
// device type the IPC windows need to reach (its stream). Never included outside src/device.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "device/device.h"
#include "smddp/errors.h"

namespace smddp::device::cuda {

// "smddp: cuda: <what> failed: <CUDA's name> (<CUDA's message>)", for check() and for callers
// that throw other kinds of error.
inline std::string failure(cudaError_t e, const char* what) {
  return std::string("smddp: cuda: ") + what + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

// Throws SystemError(failure(e, what)) unless `e` is success, and clears CUDA's sticky last error
// so the next call does not report this one again.
inline void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw SystemError(failure(e, what));
}

// True if GPU `ordinal`'s primary context is active (the driver's cuDevicePrimaryCtxGetState).
// Making a GPU current whose context is not active creates one (hundreds of MiB on that GPU):
// torch's c10::cuda::MaybeSetDevice avoids that, and so does DeviceScope. False where the driver
// cannot be asked.
bool primary_context_active(int ordinal);

// Makes GPU `ordinal` current on the calling thread for a scope, then gives the thread back the
// GPU it had. Collectives run on the engine thread or, inline (SMDDP_INLINE), on the caller's,
// whose current GPU is torch's current device: kernels, IPC opens and copies on a stream need the
// stream's GPU current, and the caller must find its own again. A GPU whose context is not
// active is not made current again on the way out (that would create its context); the thread
// then keeps `ordinal`, as torch's guards do. `nothrow` (destructors): errors are ignored.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal, bool nothrow = false) {
    if (cudaGetDevice(&was_) != cudaSuccess) {
      (void)cudaGetLastError();
      was_ = -1;
    }
    if (was_ == ordinal) return;
    const cudaError_t e = cudaSetDevice(ordinal);
    if (nothrow) {
      (void)cudaGetLastError();
    } else {
      check(e, "cudaSetDevice");
    }
    restore_ = e == cudaSuccess && was_ >= 0;
  }
  ~DeviceScope() {
    if (restore_ && primary_context_active(was_) && cudaSetDevice(was_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int was_ = -1;
  bool restore_ = false;
};

class StreamDevice : public Device {
 public:
  virtual cudaStream_t stream() const = 0;
  virtual int ordinal() const = 0;
};

}  // namespace smddp::device::cuda
