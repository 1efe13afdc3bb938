// A stand-in for CUDA device memory on machines without a GPU (device/cuda.h's set_cuda_stand_in):
// "device memory" the host and the network cannot touch, and a device that can. The arena is one
// memfd mapped twice: the view handed out as device pointers is PROT_NONE, so a CPU copy or
// reduction, or a send or receive by the kernel's sockets, of a device buffer that should have
// been staged faults (SIGSEGV, or EFAULT from the socket) instead of passing; the device's
// copies and reductions go through the second, writable view, and land late (LateDevice), as on
// a stream, so a missing fence shows stale bytes. Tests read and write buffers through host().
//
// Made with Reach::network, the arena stands in for device memory that the network reaches
// itself (FI_HMEM, GPUDirect): the device pointers' view is readable and writable, so sockets
// move it, and collectives across nodes hand it to the network without staging; the device's
// work still lands late, so a post before a fence sends stale bytes or receives into a buffer a
// queued reduction still reads.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "collective/late_device.h"
#include "device/cuda.h"
#include "device/device.h"

namespace smddp::testing {

class FarMemory {
 public:
  enum class Reach { device_only, network };
  explicit FarMemory(size_t bytes, Reach reach = Reach::device_only) : bytes_(bytes), reach_(reach) {
    fd_ = ::memfd_create("smddp-test-far", 0);
    if (fd_ < 0 || ::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) throw std::runtime_error("memfd");
    void* far = ::mmap(nullptr, bytes, reach == Reach::network ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_SHARED,
                       fd_, 0);
    void* near = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (far == MAP_FAILED || near == MAP_FAILED) throw std::runtime_error("mmap far memory");
    far_ = static_cast<std::byte*>(far);
    near_ = static_cast<std::byte*>(near);
  }
  ~FarMemory() {
    ::munmap(far_, bytes_);
    ::munmap(near_, bytes_);
    ::close(fd_);
  }
  FarMemory(const FarMemory&) = delete;
  FarMemory& operator=(const FarMemory&) = delete;

  // A "device" buffer of `count` Ts (64-byte aligned); reset() frees them all.
  template <class T>
  T* alloc(size_t count) {
    const size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    if (used_ + bytes > bytes_) throw std::runtime_error("far memory arena exhausted");
    T* p = reinterpret_cast<T*>(far_ + used_);
    used_ += bytes;
    return p;
  }
  void reset() { used_ = 0; }
  bool network_reaches() const { return reach_ == Reach::network; }
  // Reductions its devices ran (a staged collective reduces on the host, never here).
  size_t device_reductions() const { return reductions_.load(); }
  void count_reduction() const { reductions_.fetch_add(1); }
  // The host's view of a device pointer (the test's own reads and writes; the device's work).
  template <class T>
  T* host(T* device_ptr) const {
    return reinterpret_cast<T*>(translate(device_ptr));
  }
  // Device pointers become their writable view; any other pointer (host memory) is itself.
  void* translate(const void* p) const {
    const auto* b = static_cast<const std::byte*>(p);
    if (b >= far_ && b < far_ + bytes_) return near_ + (b - far_);
    return const_cast<void*>(p);
  }

 private:
  size_t bytes_, used_ = 0;
  Reach reach_;
  mutable std::atomic<size_t> reductions_{0};
  int fd_ = -1;
  std::byte *far_ = nullptr, *near_ = nullptr;
};

// The device of that memory: copies and reductions in any direction between it and host memory,
// late (on LateDevice's worker thread), fence() when they landed.
class FarDevice final : public device::Device {
 public:
  // on_copy: called as each copy is queued (a test's fault injection), if set.
  explicit FarDevice(const FarMemory& mem, std::function<void()> on_copy = {}) : mem_(mem), on_copy_(std::move(on_copy)) {}
  const char* name() const override { return "far"; }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (on_copy_) on_copy_();
    late_.copy(mem_.translate(dst), mem_.translate(src), bytes);
  }
  void reduce(const reduce::ReduceArgs& args) override {
    std::vector<const void*> srcs(args.srcs, args.srcs + args.nsrc);
    for (auto& s : srcs) s = mem_.translate(s);
    reduce::ReduceArgs a = args;
    a.dst = mem_.translate(args.dst);
    a.srcs = srcs.data();
    mem_.count_reduction();
    late_.reduce(a);  // LateDevice keeps its own copy of the sources' addresses
  }
  void fence() override { late_.fence(); }
  bool network_addressable() const override { return mem_.network_reaches(); }
  // Host memory is the network's too; the arena only with Reach::network.
  bool network_reaches(const void* p) const override { return mem_.network_reaches() || mem_.translate(p) == p; }

 private:
  const FarMemory& mem_;
  std::function<void()> on_copy_;
  LateDevice late_;
};

// While it lives, CUDA is stood in for (device/cuda.h's set_cuda_stand_in): every GPU is a
// FarDevice on `mem`.
class FarDeviceStandIn {
 public:
  explicit FarDeviceStandIn(const FarMemory& mem, std::function<void()> on_copy = {}) {
    device::set_cuda_stand_in([&mem, on_copy](int) { return std::make_unique<FarDevice>(mem, on_copy); });
  }
  ~FarDeviceStandIn() { device::set_cuda_stand_in({}); }
  FarDeviceStandIn(const FarDeviceStandIn&) = delete;
  FarDeviceStandIn& operator=(const FarDeviceStandIn&) = delete;
};

}  // namespace smddp::testing
