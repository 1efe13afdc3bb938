// Peer windows over host memory: cross-memory attach. See peer_window.h.
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include "device/peer_window.h"
#include "smddp/errors.h"

namespace smddp::device {

namespace {

struct CmaDescriptor {
  uint64_t address;
  uint64_t bytes;
  // A word of the exposing process and its value: a peer that reads it back through
  // process_vm_readv can read this process (reachable()).
  uint64_t probe_address;
  uint64_t probe_value;
};
static_assert(sizeof(CmaDescriptor) <= PeerWindows::kDescriptorBytes);

class CmaWindows final : public PeerWindows {
 public:
  explicit CmaWindows(std::function<int(int)> pid_of) : pid_of_(std::move(pid_of)) {
    std::random_device rd;
    probe_ = (uint64_t{rd()} << 32 | rd()) | 1;  // never 0, what a zeroed page reads
  }
  const char* name() const override { return "cma"; }

  bool expose(const void* p, size_t bytes, std::byte* desc) override {
    const CmaDescriptor d{reinterpret_cast<uint64_t>(p), bytes, reinterpret_cast<uint64_t>(&probe_), probe_};
    std::memcpy(desc, &d, sizeof d);
    return true;  // any memory of this process can be read by a peer allowed to
  }

  PeerBuffer open(int peer, const std::byte* desc) override {
    CmaDescriptor d;
    std::memcpy(&d, desc, sizeof d);
    return {peer, d.address, static_cast<size_t>(d.bytes), nullptr};
  }

  // The peer's probe word, read back: fails where ptrace rules (Yama, a container's seccomp)
  // refuse process_vm_readv, and differs where the peer's pid names another process here (the
  // peer runs in another PID namespace that shares /dev/shm with this one).
  bool reachable(int peer, const std::byte* desc, std::string* why) override {
    CmaDescriptor d;
    std::memcpy(&d, desc, sizeof d);
    uint64_t got = 0;
    iovec l{&got, sizeof got}, r{reinterpret_cast<void*>(d.probe_address), sizeof got};
    const int pid = pid_of_(peer);
    ssize_t n;
    do n = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    while (n < 0 && errno == EINTR);
    const int err = errno;
    if (n == static_cast<ssize_t>(sizeof got) && got == d.probe_value) return true;
    *why = "process_vm_readv from local rank " + std::to_string(peer) + " (pid " + std::to_string(pid) + "): " +
           (n < 0 ? std::strerror(err) : "read back another value (another process has its pid here)");
    return false;
  }
  bool needs_probe() const override { return true; }

  void read(const PeerBuffer& b, size_t offset, void* dst, size_t bytes, const OpInfo& op) override {
    move(b, offset, static_cast<std::byte*>(dst), bytes, op, /*to_peer=*/false);
  }
  bool writable() const override { return true; }
  void write(const PeerBuffer& b, size_t offset, const void* src, size_t bytes, const OpInfo& op) override {
    move(b, offset, const_cast<std::byte*>(static_cast<const std::byte*>(src)), bytes, op, /*to_peer=*/true);
  }

 private:
  // process_vm_writev needs the same ptrace permission as process_vm_readv, so a peer that
  // reachable() found readable is writable too.
  void move(const PeerBuffer& b, size_t offset, std::byte* local, size_t bytes, const OpInfo& op, bool to_peer) {
    const int pid = pid_of_(b.peer);
    check_within(b, offset, bytes, op);
    uint64_t remote = b.remote + offset;
    while (bytes > 0) {
      iovec l{local, bytes}, r{reinterpret_cast<void*>(remote), bytes};
      const ssize_t n = to_peer ? ::process_vm_writev(pid, &l, 1, &r, 1, 0) : ::process_vm_readv(pid, &l, 1, &r, 1, 0);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        throw SystemError("smddp: " + op.describe() + ": " + (to_peer ? "writing " : "reading ") +
                          std::to_string(bytes) + " bytes " + (to_peer ? "to" : "from") + " local rank " +
                          std::to_string(b.peer) + " (pid " + std::to_string(pid) + ") with " +
                          (to_peer ? "process_vm_writev" : "process_vm_readv") +
                          " failed: " + std::strerror(n < 0 ? errno : EIO));
      }
      local += n;
      remote += static_cast<uint64_t>(n);
      bytes -= static_cast<size_t>(n);
    }
  }

  std::function<int(int)> pid_of_;
  uint64_t probe_;
};

}  // namespace

std::unique_ptr<PeerWindows> cma_windows(std::function<int(int)> pid_of) {
  return std::make_unique<CmaWindows>(std::move(pid_of));
}

}  // namespace smddp::device
