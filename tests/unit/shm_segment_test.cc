// The shared-memory segments' protection (docs/security.md): mode 0600 under a name no other
// user can open, whatever they guess.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "smddp/errors.h"
#include "transport/shm/shm_segment.h"

namespace smddp::shm {
namespace {

TEST(ShmSegment, AnotherUserCannotOpenASegment) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to become another user (nobody) in a child process";
  const std::string name = "/smddp-uid-test-" + std::to_string(::getpid());
  Segment seg = Segment::create(name, 4096);
  struct stat st{};
  ASSERT_EQ(::stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the segment's mode";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // nobody:nogroup tries to open it, for reading and for writing
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    for (int mode : {O_RDONLY, O_RDWR}) {
      const int fd = ::shm_open(name.c_str(), mode, 0);
      if (fd >= 0) ::_exit(1);
      if (errno != EACCES) ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 1) << "another user opened the segment";
  EXPECT_NE(WEXITSTATUS(status), 2) << "the child could not become nobody";
  EXPECT_NE(WEXITSTATUS(status), 3) << "shm_open failed, but not with EACCES";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The other direction: a name (as the Store would hand it) that points at a segment another
// user made, even one anybody may read and write, is refused rather than mapped.
TEST(ShmSegment, ASegmentOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to become another user (nobody) in a child process";
  const std::string name = "/smddp-foreign-test-" + std::to_string(::getpid());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0666);
    if (fd < 0 || ::fchmod(fd, 0666) != 0 || ::ftruncate(fd, 4096) != 0) ::_exit(3);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not make its segment";
  try {
    Segment s = Segment::open(name, 4096);
    ADD_FAILURE() << "another user's segment was mapped";
  } catch (const SystemError& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to uid 65534"), std::string::npos) << e.what();
  }
  ::shm_unlink(name.c_str());
}

// A name in the Store that points at a segment smaller than the layout (another job's, a
// stale one) is refused before anything maps past its end.
TEST(ShmSegment, ASegmentSmallerThanTheLayoutIsRefused) {
  const std::string name = "/smddp-test-small-" + std::to_string(::getpid());
  Segment small = Segment::create(name, 4096);
  try {
    Segment::open(name, 8192);
    ADD_FAILURE() << "a 4096-byte segment was opened as 8192 bytes";
  } catch (const SystemError& e) {
    EXPECT_NE(std::string(e.what()).find("is smaller than expected"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace smddp::shm
