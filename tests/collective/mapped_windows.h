// A test "device memory" with peer windows shaped like CUDA IPC (device/peer_window.h): one
// shared arena per rank (a memfd) that buffers are allocated from; a peer opens it through
// /proc/PID/fd (as cudaIpcOpenMemHandle opens cudaMalloc memory), maps it once and keeps it (the
// handle cache); memory outside the arena cannot be exposed. Reads are plain copies (the copy
// engine's part); reductions read the peers' arenas in place.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "device/peer_window.h"
#include "smddp/errors.h"

namespace smddp::testing {

class MappedWindows final : public device::PeerWindows {
 public:
  explicit MappedWindows(size_t bytes) : bytes_(bytes) {
    fd_ = ::memfd_create("smddp-test-arena", 0);
    if (fd_ < 0 || ::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) throw std::runtime_error("memfd");
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap arena");
    base_ = static_cast<std::byte*>(p);
  }
  ~MappedWindows() override {
    for (auto& [arena, m] : maps_) ::munmap(m, bytes_);  // every rank's arena has the same size
    ::munmap(base_, bytes_);
    ::close(fd_);
  }
  const char* name() const override { return "test-mapped"; }

  // Bump allocation from the arena ("device memory"); reset() frees everything.
  template <class T>
  T* alloc(size_t n) {
    const size_t at = (used_ + 63) / 64 * 64;
    if (at + n * sizeof(T) > bytes_) throw std::runtime_error("arena full");
    used_ = at + n * sizeof(T);
    return reinterpret_cast<T*>(base_ + at);
  }
  void reset() { used_ = 0; }

  bool expose(const void* p, size_t bytes, std::byte* desc) override {
    const auto* b = static_cast<const std::byte*>(p);
    if (b < base_ || b + bytes > base_ + bytes_) return false;  // not "device memory"
    const Desc d{::getpid(), fd_, static_cast<uint64_t>(b - base_), bytes, where};
    std::memcpy(desc, &d, sizeof d);
    return true;
  }
  device::PeerBuffer open(int peer, const std::byte* desc) override {
    Desc d;
    std::memcpy(&d, desc, sizeof d);
    ++open_calls_;
    if (refuse_opens) throw device::PeerUnreachable("test-mapped: no peer access to local rank " + std::to_string(peer));
    const std::pair<int, int> arena{d.pid, d.fd};  // the handle cache's key: the peer's allocation
    auto it = maps_.find(arena);
    if (it == maps_.end()) {
      const std::string path = "/proc/" + std::to_string(d.pid) + "/fd/" + std::to_string(d.fd);
      const int fd = ::open(path.c_str(), O_RDWR);
      if (fd < 0) throw SystemError("open " + path + ": " + std::strerror(errno));
      void* m = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (m == MAP_FAILED) throw SystemError("mmap " + path);
      it = maps_.emplace(arena, static_cast<std::byte*>(m)).first;
    }
    return {peer, d.offset, static_cast<size_t>(d.bytes), it->second + d.offset};
  }
  void read(const device::PeerBuffer& b, size_t offset, void* dst, size_t bytes, const OpInfo&) override {
    ++reads_;
    std::memcpy(dst, b.mapped + offset, bytes);
  }

  // Like CUDA IPC: opens may fail, agreed on once per placement (the process and `where`, as
  // a process and its GPU).
  bool needs_probe() const override { return true; }
  std::string placement(const std::byte* desc) const override {
    Desc d;
    std::memcpy(&d, desc, sizeof d);
    return std::to_string(d.pid) + "/" + std::to_string(d.where);
  }

  // Test knobs: every open() fails (as between GPUs without peer access); the placement this
  // rank's next descriptors name (as a rank that moved to another GPU).
  bool refuse_opens = false;
  int where = 0;

  int mapped_peers() const { return static_cast<int>(maps_.size()); }  // peer arenas mapped
  int open_calls() const { return open_calls_; }

 private:
  struct Desc {
    int32_t pid;
    int32_t fd;
    uint64_t offset;
    uint64_t bytes;
    int32_t where;
  };
  size_t bytes_, used_ = 0;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::map<std::pair<int, int>, std::byte*> maps_;  // (pid, fd) of a peer's arena
  int open_calls_ = 0, reads_ = 0;
};

}  // namespace smddp::testing
