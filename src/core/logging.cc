#include "core/logging.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <string>

#include "core/config.h"

namespace smddp::log {

Level threshold() {
  static const Level level = [] {
    std::string s = config::get_string("SMDDP_DEBUG");
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    // Any case, as the Python package reads it (launch_env.py): "Info" once logged there only.
    if (s == "TRACE") return Level::TRACE;
    if (s == "INFO") return Level::INFO;
    return Level::WARN;
  }();
  return level;
}

static const char* name(Level l) {
  switch (l) {
    case Level::WARN: return "WARN";
    case Level::INFO: return "INFO";
    case Level::TRACE: return "TRACE";
  }
  return "?";
}

Line::Line(Level l, int rank) {
  static const std::string host = [] {
    char h[256] = {};
    gethostname(h, sizeof h - 1);
    return std::string(h);
  }();
  os_ << host << ':' << getpid();
  if (rank >= 0) os_ << " [" << rank << ']';
  os_ << " smddp " << name(l) << ' ';
}

Line::~Line() {
  os_ << '\n';
  std::string s = os_.str();
  // One write, so that lines of several processes do not interleave (on a pipe, up to PIPE_BUF
  // bytes); the rest of a short one follows rather than being lost.
  for (size_t done = 0; done < s.size();) {
    const ssize_t r = ::write(STDERR_FILENO, s.data() + done, s.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // stderr closed or full: nothing else to do with a log line
    done += static_cast<size_t>(r);
  }
}

}  // namespace smddp::log
