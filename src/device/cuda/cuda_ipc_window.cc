// Peer windows over CUDA IPC: device memory of the node's other processes, mapped into this one
// and read by the copy engines (or in place by the reduction kernels). See peer_window.h and
// docs/gpu.md.
//  - An IPC handle names a whole cudaMalloc allocation, so expose() finds the allocation's base
//    (cuMemGetAddressRange, through the runtime's driver entry point: no link to libcuda) and
//    sends the offset beside the handle. Memory CUDA cannot export this way (cuMem/VMM memory
//    such as torch's expandable segments, host memory) is refused: the algorithm then stages.
//  - Opening a handle costs hundreds of microseconds, so each is opened once and cached by its
//    64 handle bytes. A freed allocation's address may be reused, but a new allocation has a new
//    handle, so a stale mapping is never found for it. At most kCacheEntries stay open (least
//    recently used closed first); the rest close with the windows (communicator destruction).
//  - A handle cannot be opened in the process that made it: ranks of one process (tests) get
//    the address itself. "The same process" is told by a random id drawn once per process, not
//    by the pid, which repeats across PID namespaces (containers on one node).
#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <cstring>
#include <random>
#include <list>
#include <map>
#include <string>

#include "device/cuda.h"
#include "device/cuda/cuda_support.h"

namespace smddp::device {

namespace {

struct IpcDescriptor {
  cudaIpcMemHandle_t handle;
  uint64_t offset;   // of the exposed range in the allocation
  uint64_t bytes;    // exposed
  uint64_t address;  // in the exporting process (used when the peer is this process)
  uint32_t process;  // this_process(): who made the descriptor
  int32_t device;
};
static_assert(sizeof(IpcDescriptor) <= PeerWindows::kDescriptorBytes);

// A random id of this process, the same for all its threads.
uint32_t this_process() {
  static const uint32_t id = [] {
    std::random_device rd;
    return static_cast<uint32_t>(rd());
  }();
  return id;
}

using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

GetAddressRange address_range_fn() {
  static GetAddressRange fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return GetAddressRange{nullptr};
    }
    return reinterpret_cast<GetAddressRange>(p);
  }();
  return fn;
}

class CudaIpcWindows final : public PeerWindows {
 public:
  static constexpr size_t kCacheEntries = 256;

  explicit CudaIpcWindows(cuda::StreamDevice& dev) : dev_(dev) {}
  ~CudaIpcWindows() override {
    cuda::DeviceScope on(dev_.ordinal(), /*nothrow=*/true);  // where the mappings were made
    for (auto& e : lru_) cudaIpcCloseMemHandle(e.mapped);
  }
  const char* name() const override { return "cuda_ipc"; }
  size_t opens() const { return opens_; }

  bool expose(const void* p, size_t bytes, std::byte* desc) override {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
      (void)cudaGetLastError();
      return false;
    }
    // Memory of another GPU than these windows' (the caller named the wrong device): staged.
    // Placements name the buffer's GPU, and windows are chosen by the named one: the two must be
    // the same for every rank to keep one verdict per placement in one place.
    if (attr.device != dev_.ordinal()) return false;
    cuda::DeviceScope on(attr.device);  // the driver call below needs the buffer's context current
    const GetAddressRange range = address_range_fn();
    CUdeviceptr base = 0;
    size_t size = 0;
    if (!range || range(&base, &size, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return false;
    IpcDescriptor d{};
    if (cudaIpcGetMemHandle(&d.handle, reinterpret_cast<void*>(base)) != cudaSuccess) {
      (void)cudaGetLastError();  // not cudaMalloc memory (VMM): the algorithm stages instead
      return false;
    }
    d.offset = reinterpret_cast<uint64_t>(p) - base;
    d.bytes = bytes;
    d.address = reinterpret_cast<uint64_t>(p);
    d.process = this_process();
    d.device = attr.device;
    std::memcpy(desc, &d, sizeof d);
    return true;
  }

  PeerBuffer open(int peer, const std::byte* desc) override {
    IpcDescriptor d;
    std::memcpy(&d, desc, sizeof d);
    if (d.process == this_process())
      return {peer, d.address, static_cast<size_t>(d.bytes), reinterpret_cast<const std::byte*>(d.address)};
    return {peer, d.address, static_cast<size_t>(d.bytes), mapping(d.handle, peer) + d.offset};
  }

  // An open may fail (no peer access between the two GPUs): the ranks agree on it once for each
  // placement of their buffers, a process and its GPU (peer_window.h).
  bool needs_probe() const override { return true; }
  std::string placement(const std::byte* desc) const override {
    IpcDescriptor d;
    std::memcpy(&d, desc, sizeof d);
    return std::to_string(d.process) + "/" + std::to_string(d.device);
  }

  void read(const PeerBuffer& b, size_t offset, void* dst, size_t bytes, const OpInfo& op) override {
    if (offset > b.bytes || bytes > b.bytes - offset)
      throw InvalidArgument("smddp: " + op.describe() + ": read of " + std::to_string(bytes) + " bytes at offset " +
                            std::to_string(offset) + " past the " + std::to_string(b.bytes) +
                            " bytes local rank " + std::to_string(b.peer) + " exposed");
    if (bytes == 0) return;
    cuda::DeviceScope on(dev_.ordinal());
    const cudaError_t e = cudaMemcpyAsync(dst, b.mapped + offset, bytes, cudaMemcpyDefault, dev_.stream());
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw SystemError("smddp: " + op.describe() + ": copying " + std::to_string(bytes) + " bytes from local rank " +
                        std::to_string(b.peer) + "'s device memory failed: " + cudaGetErrorString(e));
    }
  }

 private:
  using Key = std::array<char, sizeof(cudaIpcMemHandle_t)>;
  struct Entry {
    Key key;
    std::byte* mapped;
  };

  // Errors of cudaIpcOpenMemHandle that say this process cannot map a peer's memory at all, so
  // that staging is the answer: GPUs without peer access, IPC refused by the OS or container.
  static bool unreachable(cudaError_t e) {
    return e == cudaErrorPeerAccessUnsupported || e == cudaErrorInvalidDevice || e == cudaErrorMapBufferObjectFailed ||
           e == cudaErrorOperatingSystem || e == cudaErrorNotSupported;
  }

  std::byte* mapping(const cudaIpcMemHandle_t& h, int peer) {
    Key key;
    std::memcpy(key.data(), &h, key.size());
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);  // most recently used first
      return it->second->mapped;
    }
    void* p = nullptr;
    cuda::DeviceScope on(dev_.ordinal());  // the mapping is made on the current GPU
    if (const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
      (void)cudaGetLastError();
      // The GPU number is the peer process's own (its CUDA_VISIBLE_DEVICES may differ).
      const std::string what = cuda::failure(e, "cudaIpcOpenMemHandle") + " for local rank " + std::to_string(peer) +
                               "'s memory, from GPU " + std::to_string(dev_.ordinal());
      if (unreachable(e)) throw PeerUnreachable(what);
      throw SystemError(what);
    }
    ++opens_;
    lru_.push_front({key, static_cast<std::byte*>(p)});
    index_[key] = lru_.begin();
    if (lru_.size() > kCacheEntries) {
      cudaIpcCloseMemHandle(lru_.back().mapped);
      index_.erase(lru_.back().key);
      lru_.pop_back();
    }
    return static_cast<std::byte*>(p);
  }

  cuda::StreamDevice& dev_;
  std::list<Entry> lru_;
  std::map<Key, std::list<Entry>::iterator> index_;
  size_t opens_ = 0;
};

}  // namespace

std::unique_ptr<PeerWindows> cuda_ipc_windows(Device& dev) {
  auto* s = dynamic_cast<cuda::StreamDevice*>(&dev);
  if (!s) throw InvalidArgument(std::string("smddp: cuda IPC windows need a cuda device, not ") + dev.name());
  return std::make_unique<CudaIpcWindows>(*s);
}

size_t cuda_ipc_opens(const PeerWindows& windows) {
  const auto* w = dynamic_cast<const CudaIpcWindows*>(&windows);
  if (!w) throw InvalidArgument(std::string("smddp: cuda_ipc_opens needs cuda IPC windows, not ") + windows.name());
  return w->opens();
}

}  // namespace smddp::device
