// RAII owner of one POSIX shared-memory mapping.
#pragma once

#include <cstddef>
#include <string>

namespace smddp::shm {

class Segment {
 public:
  Segment() = default;
  // Creates a new segment (O_EXCL, mode 0600), sized and zero-filled.
  static Segment create(const std::string& name, size_t bytes);
  // Maps an existing segment created by another process of the same user.
  static Segment open(const std::string& name, size_t bytes);
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
};

}  // namespace smddp::shm
