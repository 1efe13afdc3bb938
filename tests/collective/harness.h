// Runs a function on N ranks that are real processes (fork), each with its own Communicator
// over a fresh FileStore, and gathers what went wrong. Every run also checks that nothing leaks:
// no /dev/shm entry of the ranks remains and each rank has as many threads after destroying its
// communicators as it had before creating them.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "smddp/smddp.h"

namespace smddp::testing {

// What a rank reports back. check() records a failure message (at most a few hundred are kept).
class Report {
 public:
  void fail(const std::string& msg);
  bool ok() const { return failures_ == 0; }
  // Free-form lines the parent can compare across ranks ("key value").
  void record(const std::string& key, const std::string& value);
  // A line of text (its first 200 characters; spaces travel as '_'), for print_records().
  void record_text(const std::string& key, const std::string& text);

  int failures_ = 0;
  std::string text_;
  std::string records_;
};

struct RunOptions {
  std::chrono::seconds wall_limit{600};  // the whole run; children are killed past it
  std::vector<std::pair<std::string, std::string>> env;  // set in the children
  // Per rank: the network namespace (a name under /var/run/netns) it runs in; empty: this one.
  std::vector<std::string> netns;
  // Per rank: extra environment (e.g. SMDDP_NODE_ID of the pretend host it runs on).
  std::vector<std::vector<std::pair<std::string, std::string>>> rank_env;
  // Runs in each rank before its threads are counted (the leak check): for a library that starts
  // threads for the process's life when first used, such as the CUDA driver's.
  std::function<void()> before_thread_count;
};

// Pretend hosts for a test (tools/netns): network namespaces joined through a bridge. Removed
// when the object goes, also when the test fails. available() is false (the test should skip)
// without root or iproute2.
class NetnsHosts {
 public:
  // n hosts, each with `rails` links (eth0..) to one bridge; `rate` caps every link (tc).
  explicit NetnsHosts(int n, const std::string& rate = "", int rails = 1);
  ~NetnsHosts();
  bool available() const { return !id_.empty(); }
  std::string ns(int host) const { return "smddp-" + id_ + "-h" + std::to_string(host); }
  std::string addr(int host, int rail = 0) const;
  // Run options placing rank r on host host_of_rank[r] (SMDDP_NODE_ID "host<h>"): in its
  // namespace over eth0 where the hosts are available, else as pretend nodes over loopback.
  RunOptions place(const std::vector<int>& host_of_rank) const;
  // Bytes the host sent over link `rail` (veth counter); rail < 0: over all its links.
  uint64_t bytes_sent(int host, int rail = -1) const;
  // TCP segments the host retransmitted so far (its namespace's /proc/net/snmp): resent bytes
  // count on the link too, so traffic figures are read beside this.
  uint64_t tcp_retransmits(int host) const;
  // Runs a shell command inside the host's namespace (tc, ip link): its output and exit status
  // ("ip link set eth0 down", "tc qdisc replace dev eth0 root netem loss 1%").
  int run_in(int host, const std::string& cmd, std::string* output = nullptr) const;
  const std::string& why_unavailable() const { return why_; }

 private:
  std::string id_, why_;
  int rails_ = 1;
};

struct RankOutcome {
  int exit_code = 0;    // -signal when killed
  std::string failures;
  std::vector<std::pair<std::string, std::string>> records;
};

struct RunResult {
  std::vector<RankOutcome> ranks;
  std::vector<std::string> problems;  // harness-level: hang, crash, leak
  bool ok() const;
  std::string summary() const;  // every failure, for the assertion message
};

// fn runs in each child with (rank, world, store, report). It makes its own communicators.
using RankFn = std::function<void(int rank, int world, std::shared_ptr<Store> store, Report& report)>;
RunResult run_ranks(int world, const RankFn& fn, const RunOptions& opts = {});
// Prints every rank's record_text() lines under `key` ("[   INFO   ] rank R: text").
void print_records(const RunResult& res, const std::string& key);

// Records a failure unless f() throws an E whose message contains `must_contain`.
template <class E, class F>
void expect_throw(Report& rep, const std::string& what, F f, const std::string& must_contain) {
  try {
    f();
    rep.fail(what + ": no exception");
  } catch (const E& e) {
    if (std::string(e.what()).find(must_contain) == std::string::npos)
      rep.fail(what + ": message lacks '" + must_contain + "': " + e.what());
  } catch (const std::exception& e) {
    rep.fail(what + ": wrong exception type: " + e.what());
  }
}

// Runs `body` in a child process with a /dev/shm of its own (a private mount namespace and a
// tmpfs of `size`, as a container's) and returns what it returned; "skip: why" where this
// machine cannot make one (no root, no mount namespaces).
std::string with_small_dev_shm(const char* size, const std::function<std::string()>& body);

// Whether this kernel has no cross-memory attach at all: qemu-user has no process_vm_readv
// (ENOSYS), so the host-memory single-copy algorithms stage there, on every rank.
bool cma_missing_here();

// Names of our segments in /dev/shm created by any of `pids` (empty when none).
std::vector<std::string> shm_leftovers(const std::vector<int>& pids);
// The ids of this process's threads (/proc/self/task).
std::vector<int> thread_ids();
int thread_count();

}  // namespace smddp::testing
