#include "transport/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "smddp/errors.h"

namespace smddp::shm {

// "N bytes free of M" for /dev/shm, where glibc's shm_open puts segments.
static std::string shm_space() {
  struct statvfs v {};
  if (::statvfs("/dev/shm", &v) != 0) return "its free space unknown";
  return "/dev/shm has " + std::to_string(static_cast<uint64_t>(v.f_bavail) * v.f_frsize) + " bytes free of " +
         std::to_string(static_cast<uint64_t>(v.f_blocks) * v.f_frsize);
}

static SystemError sys_error(const std::string& what, const std::string& name) {
  return SystemError("smddp: " + what + " of shared memory '" + name + "' failed: " + std::strerror(errno));
}

static void* map(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw sys_error("mmap", name);
  return p;
}

Segment Segment::create(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw sys_error("shm_open(create)", name);
  Segment s;
  s.name_ = name;
  s.owner_ = true;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    errno = e;
    throw sys_error("ftruncate", name);
  }
  // Reserve the pages now. tmpfs hands them out when first touched, and a touch past a full
  // /dev/shm (a container's is 64 MiB unless raised) is a SIGBUS in the middle of a collective;
  // reserved here, a short /dev/shm is an error at setup instead (NCCL's shm transport does the
  // same). posix_fallocate returns its error rather than setting errno.
  int err;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  if (err != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw NoRoomError("smddp: cannot reserve " + std::to_string(bytes) + " bytes of shared memory for '" + name +
                      "' in /dev/shm (" + std::strerror(err) + "; " + shm_space() + ")");
  }
  try {
    s.data_ = map(fd, bytes, name);
  } catch (...) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw;
  }
  ::close(fd);
  s.size_ = bytes;
  return s;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw sys_error("shm_open", name);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw SystemError("smddp: shared memory '" + name + "' is smaller than expected");
  }
  // Only a segment of this user's (rank 0 of the node created it, mode 0600): a name in the Store
  // that points at another user's segment, however readable, is refused (docs/security.md).
  if (st.st_uid != ::geteuid()) {
    ::close(fd);
    throw SystemError("smddp: shared memory '" + name + "' belongs to uid " + std::to_string(st.st_uid) +
                      ", not to this process's (" + std::to_string(::geteuid()) + ")");
  }
  Segment s;
  s.name_ = name;
  try {
    s.data_ = map(fd, bytes, name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  s.size_ = bytes;
  return s;
}

void Segment::unlink() {
  if (owner_) {
    ::shm_unlink(name_.c_str());
    owner_ = false;
  }
}

void Segment::reset() {
  if (data_) ::munmap(data_, size_);
  unlink();
  data_ = nullptr;
  size_ = 0;
}

Segment::~Segment() { reset(); }

Segment::Segment(Segment&& o) noexcept { *this = std::move(o); }

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    reset();
    name_ = std::move(o.name_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    owner_ = std::exchange(o.owner_, false);
  }
  return *this;
}

}  // namespace smddp::shm
