#include "core/fd_limit.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>

namespace smddp {

std::string fd_exhaustion_note() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return "";
  long open = -1;  // the directory's own descriptor is listed too
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++open;
    ::closedir(d);
  } else if (errno == EMFILE || errno == ENFILE) {
    open = static_cast<long>(rl.rlim_cur);  // not even one more to look with
  } else {
    return "";
  }
  constexpr long kFew = 8;
  if (open + kFew < static_cast<long>(rl.rlim_cur)) return "";
  return " (this process has " + std::to_string(open) + " file descriptors open and its limit (ulimit -n) is " +
         std::to_string(rl.rlim_cur) +
         ": a connection that found none left is never made; every communicator spanning nodes opens a libfabric "
         "domain and endpoint of its own, and over tcp a socket per peer: raise the limit)";
}

}  // namespace smddp
