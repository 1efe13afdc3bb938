// FileStore: one file per key in a shared directory. Writes are atomic (write then rename),
// `add` is serialised with flock, waits poll with a short back-off.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "smddp/errors.h"
#include "smddp/store.h"

namespace smddp {

struct FileStore::Impl {
  std::string dir;

  std::string path(const std::string& key) const {
    static const char* hex = "0123456789abcdef";
    std::string p = dir + "/k_";
    for (unsigned char c : key) {
      if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
        p += static_cast<char>(c);
      } else {
        p += '%';
        p += hex[c >> 4];
        p += hex[c & 15];
      }
    }
    return p;
  }

  bool read(const std::string& key, std::vector<uint8_t>* out) const {
    std::ifstream f(path(key), std::ios::binary);
    if (!f) return false;
    out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return true;
  }

  void write(const std::string& key, const std::vector<uint8_t>& v) const {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string final_path = path(key);
    std::string tmp = final_path + ".tmp" + std::to_string(::getpid()) + "_" + std::to_string(rng());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f) throw SystemError("smddp: FileStore cannot write " + tmp + ": " + std::strerror(errno));
      f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size()));
      if (!f) throw SystemError("smddp: FileStore write failed for " + tmp);
    }
    if (::rename(tmp.c_str(), final_path.c_str()) != 0)
      throw SystemError("smddp: FileStore rename failed for " + final_path + ": " + std::strerror(errno));
  }
};

FileStore::FileStore(std::string directory) : impl_(std::make_unique<Impl>()) {
  impl_->dir = std::move(directory);
  if (::mkdir(impl_->dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw SystemError("smddp: FileStore cannot create " + impl_->dir + ": " + std::strerror(errno));
}

FileStore::~FileStore() = default;

void FileStore::set(const std::string& key, const std::vector<uint8_t>& value) { impl_->write(key, value); }

std::vector<uint8_t> FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  std::vector<uint8_t> v;
  if (!impl_->read(key, &v)) throw SystemError("smddp: FileStore key '" + key + "' vanished");
  return v;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::string lock_path = impl_->dir + "/.lock";
  int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw SystemError("smddp: FileStore cannot open " + lock_path + ": " + std::strerror(errno));
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    // Without the lock two adds could both read the old count (a file system without flock,
    // as some network ones are): refuse rather than lose one.
    const int err = errno;
    ::close(fd);
    throw SystemError("smddp: FileStore cannot lock " + lock_path + ": " + std::strerror(err));
  }
  int64_t value = 0;
  try {
    std::vector<uint8_t> v;
    if (impl_->read(key, &v) && !v.empty()) value = std::stoll(std::string(v.begin(), v.end()));
    value += delta;
    std::string s = std::to_string(value);
    impl_->write(key, std::vector<uint8_t>(s.begin(), s.end()));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);  // releases the lock
  return value;
}

bool FileStore::check(const std::string& key) { return ::access(impl_->path(key).c_str(), F_OK) == 0; }

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    std::string missing;
    for (const auto& k : keys)
      if (::access(impl_->path(k).c_str(), F_OK) != 0) missing += (missing.empty() ? "" : ", ") + k;
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError("smddp: FileStore wait timed out after " + std::to_string(timeout.count()) +
                             " ms for keys: " + missing,
                         {});
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

}  // namespace smddp
