// RAII owner of one POSIX shared-memory mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "smddp/errors.h"

namespace smddp::shm {

// /dev/shm has no room for a new segment (create's reservation failed): the caller can say what
// its layout needs. Caught inside the library; users see a SystemError.
class NoRoomError : public SystemError {
 public:
  using SystemError::SystemError;
};

// A new segment's name: its creator's pid and pid namespace (pid_namespace_id), and a random token.
std::string new_segment_name(uint64_t pidns);
// Unlinks the segments named so by dead creators of pid namespace `pidns` (see the .cc).
void unlink_orphaned_segments(uint64_t pidns);

class Segment {
 public:
  Segment() = default;
  // Creates a new segment (O_EXCL, mode 0600), sized and zero-filled, with its first `reserved`
  // bytes' pages (all by default) reserved in /dev/shm: a NoRoomError when they do not fit.
  static Segment create(const std::string& name, size_t bytes, size_t reserved = SIZE_MAX);
  // Maps an existing segment created by another process of the same user.
  static Segment open(const std::string& name, size_t bytes);
  // Reserves the pages of [offset, offset + bytes) in /dev/shm before anything touches them: a
  // /dev/shm without room is a NoRoomError here, never a SIGBUS at the touch. Idempotent; through
  // any process's mapping of the segment, also after unlink().
  void reserve(size_t offset, size_t bytes) const;
  ~Segment();
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Removes the name from /dev/shm; the mapping stays valid. Idempotent.
  void unlink();
  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void reset();
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;  // the creator unlinks on destruction if nobody did yet
  int fd_ = -1;         // kept open for reserve()
};

}  // namespace smddp::shm
