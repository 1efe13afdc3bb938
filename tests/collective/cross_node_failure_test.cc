// Across nodes: a rank killed mid-run (kill -9) makes every other rank, on its node and on the
// others, raise an error naming it within the timeout, as does a node that cannot make its
// shared memory; and the hierarchical allreduce, allgather
// and reduce_scatter send each host's optimum over its link (veth counters), printed beside the
// direct algorithms' measured bytes and a flat ring's computed ones.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <thread>

#include "collective/harness.h"

namespace smddp::testing {
namespace {

using namespace std::chrono_literals;

// per_host ranks on each of n_hosts hosts, in rank order.
RunOptions hosts_options(const NetnsHosts& hosts, int n_hosts, int per_host) {
  std::vector<int> host_of_rank;
  for (int h = 0; h < n_hosts; ++h) host_of_rank.insert(host_of_rank.end(), static_cast<size_t>(per_host), h);
  return hosts.place(host_of_rank);
}

TEST(CrossNodeFailure, KilledRankIsNamedOnEveryNode) {
  NetnsHosts hosts(2);
  RunOptions ro = hosts_options(hosts, 2, 2);
  auto res = run_ranks(4, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.timeout = 20s;  // detection must come well before this
    Communicator c(store, rank, w, o);
    std::vector<float> v(1 << 16, 1.0f);
    c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum).wait();
    if (rank == 3) {
      std::this_thread::sleep_for(200ms);
      ::kill(::getpid(), SIGKILL);
    }
    auto t0 = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 3; ++i) c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum).wait();
      rep.fail("allreduce with a dead rank succeeded");
    } catch (const Error& e) {
      if (std::string(e.what()).find("rank 3 died") == std::string::npos)
        rep.fail("error does not name the lost rank 3: " + std::string(e.what()));
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    if (took > 10s) rep.fail("took " + std::to_string(took.count() / 1000000) + " ms");
  }, ro);
  ASSERT_EQ(res.ranks[3].exit_code, -SIGKILL);
  res.ranks[3].exit_code = 0;
  ASSERT_TRUE(res.ok()) << res.summary();
}

// The same, with the rank killed in the middle of a 64 MiB allreduce (its data half sent), and
// then the survivors of each host regroup.
TEST(CrossNodeFailure, KilledDuringA64MiBAllreduceIsNamedOnEveryNode) {
  NetnsHosts hosts(2);
  RunOptions ro = hosts_options(hosts, 2, 2);
  auto res = run_ranks(4, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    {
      Options o;
      o.timeout = 20s;
      o.name = "before";
      Communicator c(store, rank, w, o);
      std::vector<float> v(16 << 20, 1.0f);  // 64 MiB
      c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::max).wait();
      if (rank == 3)
        std::thread([] {
          std::this_thread::sleep_for(150ms);  // a 64 MiB allreduce here takes longer than this
          ::kill(::getpid(), SIGKILL);
        }).detach();
      auto t0 = std::chrono::steady_clock::now();
      try {
        for (int i = 0; i < 50; ++i) c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::max).wait();
        rep.fail("50 allreduces with a rank killed during them succeeded");
      } catch (const Error& e) {
        if (std::string(e.what()).find("rank 3") == std::string::npos)
          rep.fail("error does not name the lost rank 3: " + std::string(e.what()));
        rep.record_text("error", e.what());
      }
      const auto took = std::chrono::steady_clock::now() - t0;
      if (took > 15s) rep.fail("took " + std::to_string(took.count() / 1000000) + " ms");
    }
    if (rank == 3) return;
    // The three survivors: a new communicator (a torchelastic restart keeps the ranks it has).
    Options o;
    o.timeout = 30s;
    o.name = "survivors";
    Communicator c(store, rank, 3, o);
    std::vector<float> a(1 << 18, static_cast<float>(rank + 1)), b(a.size());
    c.allreduce(a.data(), b.data(), a.size(), DataType::f32, ReduceOp::sum).wait();
    if (b[0] != 6.0f || b.back() != 6.0f) rep.fail("the survivors' allreduce gave " + std::to_string(b[0]));
  }, ro);
  ASSERT_EQ(res.ranks[3].exit_code, -SIGKILL) << res.summary();
  res.ranks[3].exit_code = 0;
  ASSERT_TRUE(res.ok()) << res.summary();
  print_records(res, "error");
}

// One-way collectives across nodes (broadcast, scatter from the root; reduce, gather to it)
// must not let the sending side run ahead of a receiver: every collective it got ahead by would
// sit in the receiver's provider as unexpected messages, without bound. So while the receiving
// ranks sleep, the root's 200 broadcasts (and the senders' 200 reduces) cannot all complete.
// A node whose shared memory cannot be made (a container's /dev/shm without room) fails its own
// ranks at setup; a rank on another node, waiting for their addresses, fails at once too, with
// their reason, instead of at its setup timeout with none. Pretend nodes over loopback, all in
// one small /dev/shm: three ranks on host0 need 1.5 MiB of slots, host1's one rank 0.5 MiB.
TEST(CrossNodeFailure, ANodeWithoutSharedMemoryFailsEveryNodeAtOnce) {
  const std::string out = with_small_dev_shm("1m", [] {
    RunOptions ro;
    // SMDDP_SHM_AHEAD=0: two slots per rank, as the sizes above count (auto doubles them where
    // the ranks outnumber the cores).
    ro.env = {{"FI_TCP_IFACE", "lo"}, {"SMDDP_SHM_CHUNK", "256k"}, {"SMDDP_SHM_AHEAD", "0"}};
    for (int host : {0, 0, 0, 1}) ro.rank_env.push_back({{"SMDDP_NODE_ID", "host" + std::to_string(host)}});
    auto res = run_ranks(
        4,
        [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
          Options o;
          o.timeout = 60s;
          const auto t0 = std::chrono::steady_clock::now();
          expect_throw<SystemError>(rep, "setup", [&] { Communicator c(store, rank, w, o); },
                                    rank == 3 ? "rank 3: rank 0 failed to set up: cannot reserve"
                                              : "give /dev/shm more room");
          const auto took = std::chrono::steady_clock::now() - t0;
          if (took > 15s) rep.fail("the error took " + std::to_string(took / 1ms) + " ms, not moments");
        },
        ro);
    return res.ok() ? std::string("ok") : res.summary();
  });
  if (out.rfind("skip: ", 0) == 0) GTEST_SKIP() << out.substr(6);
  EXPECT_EQ(out, "ok");
}

// A rank whose libfabric endpoint fails before it has an address (here SMDDP_OFI_RAILS names no
// interface of its host; no provider, a domain that does not open, alike) leaves its reason where
// the other ranks wait for that address: each fails at once with it. They waited for their
// setup timeout and said only that the rank never joined. Rank 0 too, whose failure comes before
// the job's token.
TEST(CrossNodeFailure, ARankWhoseEndpointFailsFailsEveryRankAtOnce) {
  NetnsHosts hosts(2);
  for (int bad : {2, 0}) {
    RunOptions ro = hosts.place({0, 0, 1});
    ro.rank_env[static_cast<size_t>(bad)].emplace_back("SMDDP_OFI_RAILS", "no-such-nic0");
    auto res = run_ranks(3, [bad](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
      Options o;
      o.timeout = 60s;
      const auto t0 = std::chrono::steady_clock::now();
      expect_throw<Error>(rep, "setup", [&] { Communicator c(store, rank, w, o); },
                          rank == bad ? std::string("no-such-nic0")
                                      : "rank " + std::to_string(bad) + " failed to set up");
      const auto took = std::chrono::steady_clock::now() - t0;
      if (took > 15s) rep.fail("the error took " + std::to_string(took / 1ms) + " ms, not moments");
    }, ro);
    ASSERT_TRUE(res.ok()) << "failing rank " << bad << ": " << res.summary();
  }
}

// The job's ranks share one store server. A rank waiting on the network asks it whether another
// node aborted at most 4 times a second; it asked every 20 ms (the 2 s wait below: about 100).
TEST(CrossNodeFailure, AWaitOnTheNetworkAsksTheStoreOnlyNowAndThen) {
  struct CountingStore : Store {
    std::shared_ptr<Store> inner;
    std::atomic<int> abort_checks{0};
    void set(const std::string& k, const std::vector<uint8_t>& v) override { inner->set(k, v); }
    std::vector<uint8_t> get(const std::string& k, std::chrono::milliseconds t) override { return inner->get(k, t); }
    int64_t add(const std::string& k, int64_t d) override { return inner->add(k, d); }
    void wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override { inner->wait(k, t); }
    bool check(const std::string& k) override {
      if (k.size() >= 5 && k.compare(k.size() - 5, 5, "abort") == 0) ++abort_checks;
      return inner->check(k);
    }
  };
  RunOptions ro;
  for (int host : {0, 1}) ro.rank_env.push_back({{"SMDDP_NODE_ID", "host" + std::to_string(host)}});
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    auto counting = std::make_shared<CountingStore>();
    counting->inner = store;
    Communicator c(counting, rank, w, Options{});
    c.barrier().wait();
    if (rank == 1) std::this_thread::sleep_for(2s);
    const int before = counting->abort_checks.load();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> v(1024, 1.0f);
    c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum).wait();
    const int asked = counting->abort_checks.load() - before;
    const auto waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    if (v[5] != 2.0f) rep.fail("allreduce: wrong result");
    if (rank == 0) {
      const std::string what = std::to_string(asked) + " store checks of the abort key in a wait of " +
                               std::to_string(waited_ms.count()) + " ms";
      rep.record_text("abort_checks", what);
      if (asked > waited_ms.count() / 250 + 2) rep.fail(what);  // one per 250 ms, and one at each end
    }
  }, ro);
  print_records(res, "abort_checks");
  ASSERT_TRUE(res.ok()) << res.summary();
}

// Over tcp a communicator spanning nodes takes several file descriptors (a domain, an endpoint,
// a socket per peer, made at the first transfer). At the process's limit a connection is never
// made and the transfer waits for its deadline: the timeout then says that the descriptors ran
// out (it named only the peer). Before, a job with many process groups learnt nothing more.
TEST(CrossNodeFailure, ATransferStarvedOfFileDescriptorsSaysSo) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // UndefinedBehaviorSanitizer tests whether memory is readable through a pipe: out of
  // descriptors it reports every virtual call on an exception as an "invalid vptr".
  GTEST_SKIP() << "the sanitizers need file descriptors of their own";
#endif
  RunOptions ro;
  for (int host : {0, 1}) ro.rank_env.push_back({{"SMDDP_NODE_ID", "host" + std::to_string(host)}});
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.timeout = 3s;
    Communicator c(store, rank, w, o);
    rlimit saved{};
    ::getrlimit(RLIMIT_NOFILE, &saved);
    rlimit low = saved;
    low.rlim_cur = 256;
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0) {
      rep.fail(std::string("setrlimit(RLIMIT_NOFILE, 256): ") + std::strerror(errno));
      return;
    }
    std::vector<int> filler;  // every descriptor left, taken
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(fd);
    float f = 1;
    try {
      c.allreduce(&f, &f, 1, DataType::f32, ReduceOp::sum).wait();
      rep.fail("the allreduce ran without a descriptor to spare");
    } catch (const Error& e) {
      // libfabric 1.17's tcp;ofi_rxm never reports the connection (a timeout, with our note);
      // a provider that reports it gives its own "Too many open files".
      const std::string what = e.what();
      if (what.find("file descriptors open and its limit (ulimit -n) is 256") == std::string::npos &&
          what.find("Too many open files") == std::string::npos)
        rep.fail("the error does not name the descriptor limit: " + what);
    }
    for (int fd : filler) ::close(fd);
    ::setrlimit(RLIMIT_NOFILE, &saved);
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

TEST(CrossNodeFlowControl, SendersCannotRunAheadOfReceivers) {
  NetnsHosts hosts(2);
  RunOptions ro = hosts_options(hosts, 2, 1);
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.timeout = std::chrono::seconds(60);
    Communicator c(store, rank, w, o);
    c.barrier().wait();
    constexpr int kCalls = 200;
    const auto pause = std::chrono::milliseconds(800);
    for (int pass = 0; pass < 2; ++pass) {  // 0: broadcast from rank 0; 1: reduce to rank 1
      const bool sends = rank == 0;  // the root of the broadcast, a non-root of the reduce
      const auto t0 = std::chrono::steady_clock::now();
      if (!sends) std::this_thread::sleep_for(pause);
      for (int i = 0; i < kCalls; ++i) {
        int32_t v = sends ? i * 7 + pass : -1, out = -1;
        if (pass == 0) c.broadcast(&v, 1, DataType::i32, 0).wait();
        else c.reduce(&v, rank == 1 ? &out : nullptr, 1, DataType::i32, ReduceOp::sum, 1).wait();
        const int32_t got = pass == 0 ? v : out;
        if (!sends && got != (pass == 0 ? i * 7 : i * 7 + pass - 1)) {
          rep.fail("call " + std::to_string(i) + " got " + std::to_string(got));
          break;
        }
      }
      const auto took = std::chrono::steady_clock::now() - t0;
      // The sender ran no more than one collective ahead: it finished after the receiver woke.
      if (sends && took < pause / 2)
        rep.fail(std::string(pass == 0 ? "broadcast" : "reduce") + ": the sending rank finished " +
                 std::to_string(kCalls) + " calls in " +
                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
                 " ms while the receiver slept " + std::to_string(pause.count()) + " ms");
      c.barrier().wait();
    }
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

// Bytes each host sent over its link while every rank ran `coll` (16 MiB of data) with `algo`.
// TCP retransmissions (the veths drop packets when both cores are saturated) add resent bytes
// that say nothing about the algorithm, and only ever add: a run that saw any is repeated (three
// runs at most) and each host's smallest figure is kept. The retransmissions are printed.
std::vector<double> host_bytes(NetnsHosts& hosts, int n_hosts, int per_host, const std::string& coll,
                               const std::string& algo, size_t bytes, int attempt = 1) {
  RunOptions ro = hosts_options(hosts, n_hosts, per_host);
  std::vector<uint64_t> before(static_cast<size_t>(n_hosts)), resent(static_cast<size_t>(n_hosts));
  for (int h = 0; h < n_hosts; ++h) {
    before[static_cast<size_t>(h)] = hosts.bytes_sent(h);
    resent[static_cast<size_t>(h)] = hosts.tcp_retransmits(h);
  }
  auto res = run_ranks(n_hosts * per_host, [&](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.algorithms = coll + ":" + algo;
    Communicator c(store, rank, w, o);
    const size_t n = bytes / 4, W = static_cast<size_t>(w);
    if (coll == "allreduce") {
      std::vector<float> v(n, 1.0f);
      c.allreduce(v.data(), v.data(), n, DataType::f32, ReduceOp::sum).wait();
      if (v[12345] != static_cast<float>(w)) rep.fail("allreduce: wrong result");
    } else if (coll == "allgather") {  // S = the output
      std::vector<float> in(n / W, static_cast<float>(rank)), out(n);
      c.allgather(in.data(), out.data(), n / W, DataType::f32).wait();
      if (out[n - 1] != static_cast<float>(w - 1)) rep.fail("allgather: wrong result");
    } else {  // reduce_scatter, S = the input
      std::vector<float> in(n, 1.0f), out(n / W);
      c.reduce_scatter(in.data(), out.data(), n / W, DataType::f32, ReduceOp::sum).wait();
      if (out[0] != static_cast<float>(w)) rep.fail("reduce_scatter: wrong result");
    }
  }, ro);
  EXPECT_TRUE(res.ok()) << coll << ":" << algo << ": " << res.summary();
  std::vector<double> sent(static_cast<size_t>(n_hosts));
  uint64_t retransmitted = 0;
  for (int h = 0; h < n_hosts; ++h) {
    sent[static_cast<size_t>(h)] = static_cast<double>(hosts.bytes_sent(h) - before[static_cast<size_t>(h)]);
    retransmitted += hosts.tcp_retransmits(h) - resent[static_cast<size_t>(h)];
  }
  if (retransmitted) {
    std::printf("  (%s:%s run %d: %llu TCP segments retransmitted)\n", coll.c_str(), algo.c_str(), attempt,
                static_cast<unsigned long long>(retransmitted));
    if (attempt < 3) {
      const auto again = host_bytes(hosts, n_hosts, per_host, coll, algo, bytes, attempt + 1);
      for (size_t h = 0; h < sent.size(); ++h) sent[h] = std::min(sent[h], again[h]);
    }
  }
  return sent;
}

// For S = 16 MiB among N hosts x L ranks, the hierarchical algorithms must send within 10% of
// the optimum per host: 2(N-1)/N x S for allreduce, (N-1)/N x S for allgather (S = output) and
// reduce_scatter (S = input). The direct algorithms are measured beside them, and a flat ring
// over all ranks computed.
TEST(CrossNodeTraffic, HierarchicalAlgorithmsSendTheOptimumPerHost) {
  constexpr int kHosts = 2, kPerHost = 2;
  constexpr size_t kBytes = size_t{16} << 20;
  NetnsHosts hosts(kHosts);
  if (!hosts.available()) GTEST_SKIP() << hosts.why_unavailable();
  std::printf("%zu MiB, %d hosts x %d ranks: bytes each host sent over its link\n", kBytes >> 20, kHosts, kPerHost);
  for (std::string coll : {"allreduce", "allgather", "reduce_scatter"}) {
    const double factor = (coll == "allreduce" ? 2.0 : 1.0) * (kHosts - 1) / kHosts;
    const double optimum = factor * kBytes;
    // A flat ring over ranks 0 1 | 2 3: every rank sends factor' = (2 or 1) x (w-1)/w of S to its
    // successor, and each host has one rank whose successor is on the other host (1->2, 3->0).
    const double flat_ring = (coll == "allreduce" ? 2.0 : 1.0) * (kHosts * kPerHost - 1) / (kHosts * kPerHost) * kBytes;
    const auto hier = host_bytes(hosts, kHosts, kPerHost, coll, "hier", kBytes);
    const auto direct = host_bytes(hosts, kHosts, kPerHost, coll, "net_direct", kBytes);
    std::printf("%s\n  optimum %s x S                  %12.0f\n", coll.c_str(),
                coll == "allreduce" ? "2(N-1)/N" : "(N-1)/N ", optimum);
    for (int h = 0; h < kHosts; ++h)
      std::printf("  hier (measured), host %d         %12.0f (%.3f x optimum)\n", h, hier[static_cast<size_t>(h)],
                  hier[static_cast<size_t>(h)] / optimum);
    for (int h = 0; h < kHosts; ++h)
      std::printf("  net_direct (measured), host %d   %12.0f (%.3f x optimum)\n", h, direct[static_cast<size_t>(h)],
                  direct[static_cast<size_t>(h)] / optimum);
    std::printf("  flat ring over all ranks (computed) %8.0f (%.3f x optimum)\n", flat_ring, flat_ring / optimum);
    for (int h = 0; h < kHosts; ++h) {
      EXPECT_GE(hier[static_cast<size_t>(h)], optimum * 0.99) << coll << ", host " << h;
      EXPECT_LE(hier[static_cast<size_t>(h)], optimum * 1.10) << coll << ", host " << h << ": more than 10% above the optimum";
    }
  }
}

// The rail tests: 2 hosts of 2 ranks, each host with two links (eth0, eth1), a 16 MiB allreduce.
constexpr int kRailHosts = 2, kRailPerHost = 2, kRails = 2;
constexpr size_t kRailBytes = size_t{16} << 20;

RunOptions two_rail_options(const NetnsHosts& hosts) {
  RunOptions ro = hosts_options(hosts, kRailHosts, kRailPerHost);
  ro.env = {{"SMDDP_OFI_RAILS", "eth0,eth1"}};
  return ro;
}

// Bytes each host has sent over each of its links since this was made.
class LinkCounters {
 public:
  LinkCounters(const NetnsHosts& hosts, int n_hosts, int rails) : hosts_(hosts), rails_(rails) {
    for (int h = 0; h < n_hosts; ++h)
      for (int r = 0; r < rails; ++r) before_.push_back(hosts.bytes_sent(h, r));
  }
  double operator()(int host, int rail) const {
    return static_cast<double>(hosts_.bytes_sent(host, rail) - before_[static_cast<size_t>(host * rails_ + rail)]);
  }

 private:
  const NetnsHosts& hosts_;
  int rails_;
  std::vector<uint64_t> before_;
};

// Two links per host (rails eth0, eth1; SMDDP_OFI_RAILS names both): local rank l drives rail l,
// so the hierarchical allreduce's traffic splits evenly over a host's links, and every rank
// still reaches every other (alltoall crosses rails: rank 0 on eth0 to rank 3 on eth1).
TEST(CrossNodeTraffic, RanksSpreadOverRails) {
  NetnsHosts hosts(kRailHosts, "", kRails);
  if (!hosts.available()) GTEST_SKIP() << hosts.why_unavailable();
  const RunOptions ro = two_rail_options(hosts);
  const LinkCounters sent(hosts, kRailHosts, kRails);
  auto res = run_ranks(kRailHosts * kRailPerHost, [&](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.algorithms = "allreduce:hier";
    Communicator c(store, rank, w, o);
    std::vector<float> v(kRailBytes / 4, 1.0f);
    c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum).wait();
    if (v[4321] != static_cast<float>(w)) rep.fail("allreduce: wrong result");
    std::vector<int32_t> in(static_cast<size_t>(w)), out(static_cast<size_t>(w));
    for (int d = 0; d < w; ++d) in[static_cast<size_t>(d)] = rank * 100 + d;
    c.alltoall(in.data(), out.data(), 1, DataType::i32).wait();
    for (int s = 0; s < w; ++s)
      if (out[static_cast<size_t>(s)] != s * 100 + rank) rep.fail("alltoall: wrong block from rank " + std::to_string(s));
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
  const double optimum = 2.0 * (kRailHosts - 1) / kRailHosts * kRailBytes;
  std::printf("allreduce of %zu MiB, %d hosts x %d ranks, %d rails each: bytes per link\n", kRailBytes >> 20,
              kRailHosts, kRailPerHost, kRails);
  for (int h = 0; h < kRailHosts; ++h)
    for (int r = 0; r < kRails; ++r) {
      const double bytes = sent(h, r);
      std::printf("  host %d eth%d %12.0f (%.3f of the host's optimum)\n", h, r, bytes, bytes / optimum);
      EXPECT_GE(bytes, optimum / kRails * 0.99) << "host " << h << " rail " << r;
      EXPECT_LE(bytes, optimum / kRails * 1.10) << "host " << h << " rail " << r;
    }
}

// A subgroup with one process per node (HSDP's replicate groups, a device mesh's data-parallel
// dimension) has local rank 0 everywhere: each process names its own local rank on the node
// (Options::local_rank; the torch backend passes LOCAL_RANK), so the node's two groups take its
// two links. Before, both groups' traffic went over eth0.
TEST(CrossNodeTraffic, ASubgroupOfOneProcessPerNodeTakesTheProcesssOwnRail) {
  NetnsHosts hosts(kRailHosts, "", kRails);
  if (!hosts.available()) GTEST_SKIP() << hosts.why_unavailable();
  const RunOptions ro = two_rail_options(hosts);
  const LinkCounters sent(hosts, kRailHosts, kRails);
  auto res = run_ranks(kRailHosts * kRailPerHost, [&](int rank, int, std::shared_ptr<Store> store, Report& rep) {
    const int local = rank % kRailPerHost;  // ranks 0, 2 make group 0; ranks 1, 3 group 1
    Options o;
    o.name = "replicate" + std::to_string(local);
    o.local_rank = local;
    Communicator c(store, rank / kRailPerHost, kRailHosts, o);
    std::vector<float> v(kRailBytes / 4, static_cast<float>(rank));
    c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum).wait();
    const float want = static_cast<float>(local + (local + kRailPerHost));  // the group's two ranks
    if (v[4321] != want) rep.fail("allreduce: wrong result");
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
  // Each group's two ranks each send about the whole buffer (2 (G-1)/G with G = 2 nodes).
  for (int h = 0; h < kRailHosts; ++h)
    for (int r = 0; r < kRails; ++r) {
      const double bytes = sent(h, r);
      std::printf("  host %d eth%d %12.0f bytes (%.3f of one group's)\n", h, r, bytes, bytes / kRailBytes);
      EXPECT_GE(bytes, kRailBytes * 0.99) << "host " << h << " rail " << r;
      EXPECT_LE(bytes, kRailBytes * 1.10) << "host " << h << " rail " << r;
    }
}

}  // namespace
}  // namespace smddp::testing
