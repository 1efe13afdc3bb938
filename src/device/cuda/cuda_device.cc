// The CUDA Device: copies and reductions queued on one stream per communicator. See cuda.h.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/logging.h"
#include "device/cuda.h"
#include "device/cuda/cuda_support.h"
#include "reduce/reduce_cuda.h"
#include "smddp/types.h"

namespace smddp::device {

namespace {

// The address a kernel on the current device uses for `p`, or nullptr when it cannot read it
// (pageable host memory that was never registered).
const void* device_view(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unknown host pointer is an error on old drivers, not a fault
    return nullptr;
  }
  if (attr.type == cudaMemoryTypeUnregistered) return nullptr;
  return attr.devicePointer;
}

class CudaDevice final : public cuda::StreamDevice {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    cuda::DeviceScope on(ordinal);  // the stream is made on its GPU; the caller keeps its own
    int sms = 0;
    cuda::check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal), "cudaDeviceGetAttribute");
    max_blocks_ = static_cast<int>(std::clamp<int64_t>(config::get_int("SMDDP_CUDA_SMS"), 1, sms));
    vector_reduce_ = config::get_bool("SMDDP_CUDA_VECTOR_REDUCE");
    int pitch = 0;
    cuda::check(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, ordinal), "cudaDeviceGetAttribute");
    max_pitch_ = static_cast<size_t>(pitch);
    // Last: whatever throws above (a malformed SMDDP_CUDA_SMS) must not leak a stream, since no
    // destructor runs for a constructor that threw, and a communicator tries again per call.
    cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    SMDDP_LOG(INFO, -1) << "cuda device " << ordinal << ": reduction kernels launch with at most " << max_blocks_
                        << " of its " << sms << " SMs (SMDDP_CUDA_SMS), "
                        << (vector_reduce_ ? "16 bytes" : "one element") << " per load (SMDDP_CUDA_VECTOR_REDUCE)";
  }
  ~CudaDevice() override {
    cuda::DeviceScope on(ordinal_, /*nothrow=*/true);
    cudaStreamSynchronize(stream_);  // nothing may still read or write buffers about to be freed
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }
  // Without FI_HMEM the network reaches host memory only (page-locked or not); GPU memory and
  // managed memory, which may live on the GPU, are bounced (Device::network_reaches).
  bool network_reaches(const void* p) const override {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;  // unknown to CUDA: pageable host memory
    }
    return attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged;
  }
  cudaStream_t stream() const override { return stream_; }
  int ordinal() const override { return ordinal_; }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst == src || bytes == 0) return;
    cuda::DeviceScope on(ordinal_);
    // cudaMemcpyDefault: the direction comes from the pointers (unified addressing). A pageable
    // source is staged by the driver before this returns, so the caller may reuse it at once.
    cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
  }

  void copy_rows(void* dst, size_t dst_stride, const void* src, size_t src_stride, size_t bytes,
                 size_t rows) override {
    if (bytes == 0 || rows == 0) return;
    // Strides beyond what the 2D copy takes (cudaDevAttrMaxPitch), or one row: a copy per row.
    if (rows == 1 || dst_stride > max_pitch_ || src_stride > max_pitch_)
      return Device::copy_rows(dst, dst_stride, src, src_stride, bytes, rows);
    cuda::DeviceScope on(ordinal_);
    cuda::check(cudaMemcpy2DAsync(dst, dst_stride, src, src_stride, bytes, rows, cudaMemcpyDefault, stream_),
                "cudaMemcpy2DAsync");
  }

  void reduce(const reduce::ReduceArgs& a) override {
    if (a.count == 0) return;
    if (a.nsrc < 1) throw SystemError("smddp: cuda: a reduction of " + std::to_string(a.nsrc) + " sources");
    // One source the op leaves as it is (a rank alone, or one rank's part): a copy, on the copy
    // engines at memory speed where the kernel on SMDDP_CUDA_SMS SMs reads about 27 GB/s
    // (docs/gpu.md); in place, nothing at all.
    if (reduce::is_copy(a)) return copy(a.dst, a.srcs[0], a.count * dtype_size(a.dtype));
    // More sources than a kernel takes (a node of over 16 ranks): the CPU path, correct and slow.
    cuda::DeviceScope on(ordinal_);  // device_view asks about the current GPU
    if (a.nsrc > reduce::cuda::kMaxSources) return reduce_on_host(a);
    const void* srcs[reduce::cuda::kMaxSources];
    void* dst = const_cast<void*>(device_view(a.dst));
    bool reachable = dst != nullptr;
    for (int i = 0; i < a.nsrc && reachable; ++i) reachable = (srcs[i] = device_view(a.srcs[i])) != nullptr;
    if (!reachable) return reduce_on_host(a);
    reduce::ReduceArgs d = a;
    d.dst = dst;
    d.srcs = srcs;
    cuda::check(reduce::cuda::reduce(d, stream_, max_blocks_, vector_reduce_), "launching the reduction kernel");
  }

  void fence() override { cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:

  // Some operand is pageable host memory: drain the stream, bring device operands to the host,
  // reduce with the CPU kernels (same maths, same order), and send the result back.
  void reduce_on_host(const reduce::ReduceArgs& a) {
    fence();
    const size_t bytes = a.count * dtype_size(a.dtype);
    std::vector<std::vector<std::byte>> staged;
    staged.reserve(static_cast<size_t>(a.nsrc) + 1);
    auto on_host = [&](const void* p) -> const void* {
      if (!device_view(p)) return p;  // host memory already
      staged.emplace_back(bytes);
      // On our stream, not the legacy default stream (which our non-blocking stream does not
      // order against), then waited for.
      cuda::check(cudaMemcpyAsync(staged.back().data(), p, bytes, cudaMemcpyDefault, stream_),
                  "cudaMemcpyAsync (device to host)");
      fence();
      return staged.back().data();
    };
    std::vector<const void*> srcs;
    for (int i = 0; i < a.nsrc; ++i) srcs.push_back(on_host(a.srcs[i]));
    const bool dst_on_device = device_view(a.dst) != nullptr;
    std::vector<std::byte> out(dst_on_device ? bytes : 0);
    reduce::ReduceArgs h = a;
    h.dst = dst_on_device ? out.data() : a.dst;
    h.srcs = srcs.data();
    reduce::reduce(h);
    if (dst_on_device) {
      // cudaMemcpy from pageable memory may return before the data landed, on the legacy stream:
      // copy on ours and wait, so the next copy or a peer's read sees the result (and `out`
      // outlives the transfer).
      cuda::check(cudaMemcpyAsync(a.dst, out.data(), bytes, cudaMemcpyDefault, stream_),
                  "cudaMemcpyAsync (host to device)");
      fence();
    }
  }

  int ordinal_;
  cudaStream_t stream_ = nullptr;
  int max_blocks_ = 8;
  bool vector_reduce_ = false;
  size_t max_pitch_ = 0;  // the largest stride cudaMemcpy2DAsync takes
};

}  // namespace

bool cuda_usable(std::string* why) {
  if (cuda_stand_in()) return true;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string("CUDA runtime reports ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device is visible";
    return false;
  }
  return true;
}

int cuda_device_count() {
  if (cuda_stand_in()) return 1;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

namespace cuda {

bool primary_context_active(int ordinal) {
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using PrimaryCtxGetState = CUresult (*)(CUdevice, unsigned int*, int*);
  static const auto fns = [] {
    auto entry = [](const char* name) -> void* {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return nullptr;
      }
      return p;
    };
    return std::make_pair(reinterpret_cast<DeviceGet>(entry("cuDeviceGet")),
                          reinterpret_cast<PrimaryCtxGetState>(entry("cuDevicePrimaryCtxGetState")));
  }();
  if (!fns.first || !fns.second) return false;
  CUdevice dev = 0;
  unsigned int flags = 0;
  int active = 0;
  return fns.first(&dev, ordinal) == CUDA_SUCCESS && fns.second(dev, &flags, &active) == CUDA_SUCCESS && active;
}

}  // namespace cuda

std::unique_ptr<Device> cuda_device(int ordinal) {
  if (cuda_stand_in()) return cuda_stand_in()(ordinal);
  return std::make_unique<CudaDevice>(ordinal);
}

std::shared_ptr<void> cuda_event_after(void* stream, int device) {
  cudaEvent_t ev = nullptr;
  cudaError_t e = cudaSuccess;
  {
    cuda::DeviceScope on(device);
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess && ev) cudaEventDestroy(ev);
  }
  cuda::check(e, "recording an event on the caller's stream");
  return std::shared_ptr<void>(ev, [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
}

void cuda_wait(Device& dev, const void* event) {
  auto* s = dynamic_cast<cuda::StreamDevice*>(&dev);
  if (!s) throw InvalidArgument(std::string("smddp: cuda_wait needs a cuda device, not ") + dev.name());
  cuda::check(cudaStreamWaitEvent(s->stream(), static_cast<cudaEvent_t>(const_cast<void*>(event)), 0),
              "cudaStreamWaitEvent (the caller's stream)");
}

void* cuda_stream(Device& dev) {
  auto* s = dynamic_cast<cuda::StreamDevice*>(&dev);
  if (!s) throw InvalidArgument(std::string("smddp: cuda_stream needs a cuda device, not ") + dev.name());
  return s->stream();
}

void* cuda_malloc(size_t bytes) {
  void* p = nullptr;
  cuda::check(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc");
  return p;
}

void cuda_free(void* p) {
  if (p) cuda::check(cudaFree(p), "cudaFree");
}

bool cuda_register_host(void* p, size_t bytes) {
  if (cuda_stand_in()) return false;  // tests: CUDA is not to be started
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped) == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}

void cuda_unregister_host(void* p) {
  if (cuda_stand_in()) return;
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace smddp::device
