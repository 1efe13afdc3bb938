// Runs a benchmark's ranks as forked local processes sharing a fresh temporary directory (for
// their FileStore): `rank_main(rank, dir)` in each, its exception printed with the rank. Returns
// 0 when every rank exited 0. One copy for the benchmarks that start their own ranks (-np N).
#pragma once

#include <sys/prctl.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace smddp::bench {

inline int run_forked_ranks(int np, const char* prog, const std::function<int(int, const std::string&)>& rank_main) {
  std::string tmpl = std::string("/tmp/") + prog + "-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::perror(prog);
    return 1;
  }
  const std::string dir = tmpl;
  std::vector<pid_t> kids;
  for (int r = 0; r < np; ++r) {
    const pid_t p = fork();
    if (p == 0) {
      int rc = 1;
      try {
        rc = rank_main(r, dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s rank %d: %s\n", prog, r, e.what());
      }
      std::fflush(stdout);
      _exit(rc);
    }
    kids.push_back(p);
  }
  int rc = 0;
  for (const pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}

// Busy processes for the benchmark's lifetime (#18's "hog": dataloader workers or a preprocessing
// job beside the ranks), killed when this goes out of scope, or with the benchmark if it dies.
class BusyProcesses {
 public:
  explicit BusyProcesses(int n) {
    const pid_t parent = getpid();
    for (int i = 0; i < n; ++i) {
      const pid_t p = fork();
      if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0);  // the benchmark died before the signal was armed
        volatile unsigned long spins = 0;
        for (;;) spins = spins + 1;
      }
      if (p > 0) pids_.push_back(p);
    }
  }
  ~BusyProcesses() {
    for (const pid_t p : pids_) kill(p, SIGKILL);
    for (const pid_t p : pids_) waitpid(p, nullptr, 0);
  }
  BusyProcesses(const BusyProcesses&) = delete;
  BusyProcesses& operator=(const BusyProcesses&) = delete;

 private:
  std::vector<pid_t> pids_;
};

}  // namespace smddp::bench
