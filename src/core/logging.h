// Logging in the spirit of NCCL_DEBUG: SMDDP_DEBUG=WARN|INFO|TRACE, lines prefixed with
// host, pid and (when known) rank.  Usage: SMDDP_LOG(INFO, rank) << "chose " << name;
#pragma once

#include <sstream>

namespace smddp::log {

enum class Level { WARN = 0, INFO = 1, TRACE = 2 };

Level threshold();  // from SMDDP_DEBUG, read once
inline bool enabled(Level l) { return static_cast<int>(l) <= static_cast<int>(threshold()); }

// Collects one line and writes it to stderr (atomically) when destroyed.
class Line {
 public:
  Line(Level l, int rank);
  ~Line();
  template <class T>
  Line& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

}  // namespace smddp::log

#define SMDDP_LOG(level, rank)                                  \
  if (!::smddp::log::enabled(::smddp::log::Level::level)) {     \
  } else                                                        \
    ::smddp::log::Line(::smddp::log::Level::level, (rank))
