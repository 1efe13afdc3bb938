#include "collective/harness.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#if defined(__SANITIZE_ADDRESS__)
#define SMDDP_HARNESS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SMDDP_HARNESS_LSAN 1
#endif
#endif
#ifdef SMDDP_HARNESS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace smddp::testing {

namespace fs = std::filesystem;

void Report::fail(const std::string& msg) {
  if (++failures_ <= 200) text_ += msg + "\n";
}

void Report::record(const std::string& key, const std::string& value) { records_ += key + " " + value + "\n"; }

void Report::record_text(const std::string& key, const std::string& text) {
  std::string token = text.substr(0, 200);  // a record's value is one word
  std::replace(token.begin(), token.end(), ' ', '_');
  record(key, token);
}

void print_records(const RunResult& res, const std::string& key) {
  for (size_t r = 0; r < res.ranks.size(); ++r)
    for (auto [k, v] : res.ranks[r].records) {
      if (k != key) continue;
      std::replace(v.begin(), v.end(), '_', ' ');
      std::printf("[   INFO   ] rank %zu: %s\n", r, v.c_str());
    }
}

bool RunResult::ok() const {
  if (!problems.empty()) return false;
  for (const auto& r : ranks)
    if (r.exit_code != 0 || !r.failures.empty()) return false;
  return true;
}

std::string RunResult::summary() const {
  std::string s;
  for (const auto& p : problems) s += "harness: " + p + "\n";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].exit_code != 0) s += "rank " + std::to_string(i) + " exit code " + std::to_string(ranks[i].exit_code) + "\n";
    if (!ranks[i].failures.empty()) s += "rank " + std::to_string(i) + ":\n" + ranks[i].failures;
  }
  if (s.size() > 20000) s = s.substr(0, 20000) + "\n...(truncated)";
  return s;
}

std::vector<int> thread_ids() {
  std::vector<int> ids;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ids.push_back(std::atoi(e->d_name));
    closedir(d);
  }
  return ids;
}

int thread_count() { return static_cast<int>(thread_ids().size()); }

// The rank's open descriptors, each as what it points to ("socket:[123]", "/dev/shm/smddp-...").
// An open descriptor: what it points to, for the message, and the file itself (device, inode),
// to compare. The name alone may change under a rank that moves to a mount namespace of its own
// (inside a chroot the kernel then writes a file's path from the real root).
struct OpenFd {
  std::string what;
  dev_t dev = 0;
  ino_t ino = 0;
  bool same_file(const OpenFd& o) const { return dev == o.dev && ino == o.ino; }
};

std::map<int, OpenFd> open_fds() {
  std::map<int, OpenFd> fds;
  if (DIR* d = opendir("/proc/self/fd")) {
    const int own = dirfd(d);
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const int fd = std::atoi(e->d_name);
      if (fd == own) continue;
      char target[256] = {};
      const ssize_t n = readlink(("/proc/self/fd/" + std::string(e->d_name)).c_str(), target, sizeof target - 1);
      OpenFd f;
      f.what = n > 0 ? std::string(target, static_cast<size_t>(n)) : "?";
      struct stat st {};
      if (::fstat(fd, &st) == 0) f.dev = st.st_dev, f.ino = st.st_ino;
      fds[fd] = f;
    }
    closedir(d);
  }
  return fds;
}

std::vector<std::string> shm_leftovers(const std::vector<int>& pids) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    std::string n = e.path().filename().string();
    for (int pid : pids)
      if (n.rfind("smddp-" + std::to_string(pid) + "-", 0) == 0) out.push_back(n);
  }
  return out;
}

RunResult run_ranks(int world, const RankFn& fn, const RunOptions& opts) {
  char tmpl[] = "/tmp/smddp-test-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  RunResult result;
  result.ranks.resize(static_cast<size_t>(world));
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      for (const auto& [k, v] : opts.env) setenv(k.c_str(), v.c_str(), 1);
      if (static_cast<size_t>(r) < opts.rank_env.size())
        for (const auto& [k, v] : opts.rank_env[static_cast<size_t>(r)]) setenv(k.c_str(), v.c_str(), 1);
      if (static_cast<size_t>(r) < opts.netns.size() && !opts.netns[static_cast<size_t>(r)].empty()) {
        int fd = open(("/var/run/netns/" + opts.netns[static_cast<size_t>(r)]).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(4);
        close(fd);
      }
      Report report;
      int code = 0;
      try {
#if defined(__SANITIZE_THREAD__)
        // ThreadSanitizer starts a thread of its own in a forked child when the child makes its
        // first thread, and keeps it: make it appear before counting. The thread made for that
        // may still be listed just after join() (below): wait for it to go, or the count before
        // is one too many.
        pid_t joined = 0;
        std::thread([&joined] { joined = static_cast<pid_t>(::syscall(SYS_gettid)); }).join();
        const std::string task = "/proc/self/task/" + std::to_string(joined);
        for (int i = 0; i < 1000 && ::access(task.c_str(), F_OK) == 0; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
#endif
        if (opts.before_thread_count) opts.before_thread_count();
        const int threads_before = thread_count();
        const std::map<int, OpenFd> fds_before = open_fds();
        {
          auto store = std::make_shared<FileStore>(dir + "/store");
          fn(r, world, store, report);
        }
        // A thread join() returned for may still be listed for a moment: the kernel wakes the
        // joiner (clears the tid) before it reaps the task. A leaked thread stays; give a joined
        // one up to a second to go (a tight create/join loop here saw it half the time).
        int threads_after = thread_count();
        for (int i = 0; i < 1000 && threads_after > threads_before; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          threads_after = thread_count();
        }
        if (threads_after != threads_before)
          report.fail("thread leak: " + std::to_string(threads_before) + " threads before, " +
                      std::to_string(threads_after) + " after");
        for (const auto& [fd, now] : open_fds()) {
          const std::string& what = now.what;
          const auto before = fds_before.find(fd);
          if (before != fds_before.end() && before->second.same_file(now)) continue;
          // Drivers' device files (CUDA, EFA verbs) stay open for the process's life once a
          // library first uses them: not ours to close.
          if (what.rfind("/dev/nvidia", 0) == 0 || what.rfind("/dev/infiniband/", 0) == 0) continue;
          report.fail("fd leak: fd " + std::to_string(fd) + " (" + what + ") still open");
        }
#ifdef SMDDP_HARNESS_LSAN
        // A rank ends in _exit, which skips the leak check LeakSanitizer runs at exit: run it here
        // (the sanitize step sets detect_leaks=1), or no multi-rank test would ever report a leak.
        if (__lsan_do_recoverable_leak_check())
          report.fail("LeakSanitizer found leaks in rank " + std::to_string(r) + " (its report is above)");
#endif
      } catch (const std::exception& e) {
        report.fail(std::string("uncaught exception: ") + e.what());
        code = 3;
      }
      std::ofstream(dir + "/rank" + std::to_string(r) + ".fail") << report.text_;
      std::ofstream(dir + "/rank" + std::to_string(r) + ".rec") << report.records_;
      _exit(code ? code : (report.ok() ? 0 : 1));
    }
    pids.push_back(pid);
  }
  auto deadline = std::chrono::steady_clock::now() + opts.wall_limit;
  std::vector<bool> done(static_cast<size_t>(world), false);
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (done[static_cast<size_t>(r)]) continue;
      int status = 0;
      pid_t w = waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG);
      if (w == pids[static_cast<size_t>(r)]) {
        done[static_cast<size_t>(r)] = true;
        --remaining;
        result.ranks[static_cast<size_t>(r)].exit_code =
            WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      result.problems.push_back("ranks still running after " + std::to_string(opts.wall_limit.count()) +
                                " s: killed (a hang)");
      for (int r = 0; r < world; ++r)
        if (!done[static_cast<size_t>(r)]) kill(pids[static_cast<size_t>(r)], SIGKILL);
      for (int r = 0; r < world; ++r)
        if (!done[static_cast<size_t>(r)]) waitpid(pids[static_cast<size_t>(r)], nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int r = 0; r < world; ++r) {
    auto& o = result.ranks[static_cast<size_t>(r)];
    std::ifstream f(dir + "/rank" + std::to_string(r) + ".fail");
    std::stringstream ss;
    ss << f.rdbuf();
    o.failures = ss.str();
    std::ifstream rec(dir + "/rank" + std::to_string(r) + ".rec");
    std::string k, v;
    while (rec >> k >> v) o.records.emplace_back(k, v);
  }
  std::vector<int> ipids(pids.begin(), pids.end());
  for (const auto& n : shm_leftovers(ipids)) result.problems.push_back("leaked /dev/shm/" + n);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return result;
}

namespace {
std::string run_capture(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    if (pclose(p) != 0) return "";
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}
const std::string kNetns = std::string(SMDDP_SOURCE_DIR) + "/tools/netns";
}  // namespace

NetnsHosts::NetnsHosts(int n, const std::string& rate, int rails) : rails_(rails) {
  if (geteuid() != 0) { why_ = "needs root"; return; }
  if (run_capture("command -v ip").empty()) { why_ = "needs iproute2"; return; }
  id_ = run_capture(kNetns + " up " + std::to_string(n) + (rate.empty() ? "" : " --rate " + rate) + " --rails " +
                    std::to_string(rails) + " 2>/dev/null");
  if (id_.empty()) why_ = "tools/netns up failed (no network namespaces here?)";
}

NetnsHosts::~NetnsHosts() {
  if (id_.empty()) return;
  run_capture(kNetns + " down " + id_);
  // Nothing of the set may stay: its namespaces, their /etc/netns files, its bridge and veths
  // (the kernel removes a deleted link asynchronously: give it a few seconds).
  const std::string look = "{ ip netns list; ip -o link show; ls -d /etc/netns/*; } 2>/dev/null | grep -e 'smddp-" + id_ +
                           "-' -e 'sdb" + id_ + "' -e 'sd" + id_ + "'";
  std::string left = run_capture(look);
  for (int i = 0; i < 50 && !left.empty(); ++i) {
    ::usleep(100000);
    left = run_capture(look);
  }
  if (!left.empty()) ADD_FAILURE() << "namespace hosts " << id_ << " left behind:\n" << left;
}

RunOptions NetnsHosts::place(const std::vector<int>& host_of_rank) const {
  RunOptions ro;
  ro.env = {{"FI_TCP_IFACE", available() ? "eth0" : "lo"}};
  for (int h : host_of_rank) {
    ro.rank_env.push_back({{"SMDDP_NODE_ID", "host" + std::to_string(h)}});
    ro.netns.push_back(available() ? ns(h) : "");
  }
  return ro;
}

std::string NetnsHosts::addr(int host, int rail) const {
  return run_capture(kNetns + " addr " + id_ + " " + std::to_string(host) + " " + std::to_string(rail));
}

uint64_t NetnsHosts::bytes_sent(int host, int rail) const {
  if (rail < 0) {
    uint64_t sum = 0;
    for (int r = 0; r < rails_; ++r) sum += bytes_sent(host, r);
    return sum;
  }
  std::string v = run_capture(kNetns + " bytes " + id_ + " " + std::to_string(host) + " " + std::to_string(rail));
  return v.empty() ? 0 : std::stoull(v);
}

int NetnsHosts::run_in(int host, const std::string& cmd, std::string* output) const {
  const std::string marker = "__smddp_status=";
  std::string out = run_capture("ip netns exec " + ns(host) + " sh -c '" + cmd + "' 2>&1; echo " + marker + "$?");
  const size_t at = out.rfind(marker);
  const int status = at == std::string::npos ? -1 : std::atoi(out.c_str() + at + marker.size());
  if (output) *output = out.substr(0, at == std::string::npos ? out.size() : at);
  return status;
}

uint64_t NetnsHosts::tcp_retransmits(int host) const {
  // /proc/net/snmp has a "Tcp:" header line naming the fields, then a "Tcp:" line of values.
  std::string v = run_capture("ip netns exec " + ns(host) +
                              " awk '/^Tcp:/ { if (!n) { for (i = 1; i <= NF; i++) if ($i == \"RetransSegs\") f = i; n = 1 }"
                              " else print $f }' /proc/net/snmp");
  return v.empty() ? 0 : std::stoull(v);
}

// Runs `body` in a child process with a /dev/shm of its own (a private mount namespace and a
// tmpfs of `size`, as a container's) and returns what it returned; "skip: why" where this
// machine cannot make one (no root, no mount namespaces).
std::string with_small_dev_shm(const char* size, const std::function<std::string()>& body) {
  if (::geteuid() != 0) return "skip: needs root, to mount a small /dev/shm in a private mount namespace";
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return std::string("pipe: ") + std::strerror(errno);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::string out;
    const std::string opts = std::string("size=") + size;
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", "/dev/shm", "tmpfs", 0, opts.c_str()) != 0)
      out = std::string("skip: no private /dev/shm here: ") + std::strerror(errno);
    else
      try {
        out = body();
      } catch (const std::exception& e) {  // never unwind into gtest in this child
        out = std::string("the body threw: ") + e.what();
      }
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::write(pipe_fds[1], out.data() + done, out.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status)) return "the child died (status " + std::to_string(status) + "): " + out;
  return out;
}

bool cma_missing_here() {
  int word = 1, copy = 0;
  iovec local{&copy, sizeof copy}, remote{&word, sizeof word};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) < 0 && errno == ENOSYS;
}

}  // namespace smddp::testing
