#include "transport/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <utility>

#include "smddp/errors.h"

namespace smddp::shm {

static std::string random_token() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << rd() << rd() << rd();
  return os.str();
}

// A segment's name: its creator's pid and pid namespace, and a random token.
std::string new_segment_name(uint64_t pidns) {
  return "/smddp-" + std::to_string(::getpid()) + "-" + std::to_string(pidns) + "-" + random_token();
}

// Local rank 0 unlinks the node's segment once every node-mate has mapped it; killed before that
// (SIGKILL, or torchrun's SIGTERM when a node-mate failed at start-up) it leaves the name behind,
// and every elastic restart would add one until /dev/shm is full. So a creator first unlinks the
// segments of dead creators in its own pid namespace (a pid of another namespace that shares this
// /dev/shm, a container of the same pod, cannot be looked up from here); a pid reused since is
// taken as alive and its segment left. Dead means no such process (ESRCH), not process_dead's
// zombie test: a /proc of another pid namespace (unshare -p without its own /proc) would name
// some other process there.
void unlink_orphaned_segments(uint64_t pidns) {
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return;
  while (const dirent* e = ::readdir(dir)) {
    int pid = 0, end = 0;
    unsigned long long ns = 0;
    if (std::sscanf(e->d_name, "smddp-%d-%llu-%*[0-9a-f]%n", &pid, &ns, &end) == 2 && end > 0 &&
        e->d_name[end] == '\0' && ns == pidns && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH)
      ::shm_unlink((std::string(1, '/') += e->d_name).c_str());  // not "/" + ...: g++ 12's false -Wrestrict
  }
  ::closedir(dir);
}

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

Segment Segment::create(const std::string& name, size_t bytes, size_t reserved) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw sys_error("shm_open(create)", name);
  Segment s;  // from here on its destructor closes, unlinks and unmaps whatever throws
  s.name_ = name;
  s.owner_ = true;
  s.fd_ = fd;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) throw sys_error("ftruncate", name);
  s.reserve(0, std::min(reserved, bytes));
  s.data_ = map(fd, bytes, name);
  s.size_ = bytes;
  return s;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw sys_error("shm_open", name);
  Segment s;
  s.name_ = name;
  s.fd_ = fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes)
    throw SystemError("smddp: shared memory '" + name + "' is smaller than expected");
  // Only a segment of this user's (rank 0 of the node created it, mode 0600): a name in the Store
  // that points at another user's segment, however readable, is refused (docs/security.md).
  if (st.st_uid != ::geteuid())
    throw SystemError("smddp: shared memory '" + name + "' belongs to uid " + std::to_string(st.st_uid) +
                      ", not to this process's (" + std::to_string(::geteuid()) + ")");
  s.data_ = map(fd, bytes, name);
  s.size_ = bytes;
  return s;
}

// tmpfs hands out a page when it is first touched, and a touch past a full /dev/shm (a
// container's is 64 MiB unless raised) is a SIGBUS in the middle of a collective. Reserved
// first, a short /dev/shm is an error at a point that can say what needed the room (NCCL's shm
// transport reserves too). posix_fallocate returns its error rather than setting errno; on a
// range already reserved it allocates nothing.
void Segment::reserve(size_t offset, size_t bytes) const {
  if (bytes == 0) return;
  int err;
  do {
    err = ::posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes));
  } while (err == EINTR);
  if (err == 0) return;
  const std::string what = "smddp: cannot reserve " + std::to_string(bytes) + " bytes of shared memory for '" + name_ +
                           "' in /dev/shm (" + std::strerror(err) + "; " + shm_space() + ")";
  if (err == ENOSPC) throw NoRoomError(what);
  throw SystemError(what);  // ENOMEM (a memory cgroup's limit), EFBIG, ...: not /dev/shm's size
}

void Segment::unlink() {
  if (owner_) {
    ::shm_unlink(name_.c_str());
    owner_ = false;
  }
}

void Segment::reset() {
  if (data_) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
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
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

}  // namespace smddp::shm
