// Across nodes: a rank killed mid-run (kill -9) makes every other rank, on its node and on the
// others, raise an error naming it within the timeout; and the hierarchical allreduce sends each
// host's optimum 2(N-1)/N x S bytes over its link (veth counters), printed beside the direct
// algorithm's measured bytes and a flat ring's computed ones.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

#include "collective/harness.h"

namespace smddp::testing {
namespace {

using namespace std::chrono_literals;

RunOptions hosts_options(NetnsHosts* hosts, int n_hosts, int per_host) {
  RunOptions ro;
  ro.env = {{"FI_TCP_IFACE", hosts ? "eth0" : "lo"}};
  for (int h = 0; h < n_hosts; ++h)
    for (int i = 0; i < per_host; ++i) {
      ro.rank_env.push_back({{"SMDDP_NODE_ID", "host" + std::to_string(h)}});
      ro.netns.push_back(hosts ? hosts->ns(h) : "");
    }
  return ro;
}

TEST(CrossNodeFailure, KilledRankIsNamedOnEveryNode) {
  NetnsHosts hosts(2);
  RunOptions ro = hosts_options(hosts.available() ? &hosts : nullptr, 2, 2);
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

TEST(CrossNodeTraffic, HierarchicalAllreduceSendsTheOptimumPerHost) {
  constexpr int kHosts = 2, kPerHost = 2;
  constexpr size_t kBytes = size_t{16} << 20;
  NetnsHosts hosts(kHosts);
  if (!hosts.available()) GTEST_SKIP() << hosts.why_unavailable();
  double measured[2][kHosts];
  const char* algos[2] = {"hier", "net_direct"};
  for (int a = 0; a < 2; ++a) {
    RunOptions ro = hosts_options(&hosts, kHosts, kPerHost);
    std::vector<uint64_t> before(kHosts);
    for (int h = 0; h < kHosts; ++h) before[static_cast<size_t>(h)] = hosts.bytes_sent(h);
    auto res = run_ranks(kHosts * kPerHost, [algo = std::string(algos[a])](int rank, int w, std::shared_ptr<Store> store,
                                                                            Report& rep) {
      Options o;
      o.algorithms = "allreduce:" + algo;
      Communicator c(store, rank, w, o);
      std::vector<float> v(kBytes / 4, 1.0f);
      c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum).wait();
      if (v[12345] != static_cast<float>(w)) rep.fail("wrong result");
    }, ro);
    ASSERT_TRUE(res.ok()) << res.summary();
    for (int h = 0; h < kHosts; ++h)
      measured[a][h] = static_cast<double>(hosts.bytes_sent(h) - before[static_cast<size_t>(h)]);
  }
  const double optimum = 2.0 * (kHosts - 1) / kHosts * kBytes;
  // A flat ring over ranks 0 1 | 2 3: each rank sends 2(w-1)/w x S to its successor; host 0's
  // link carries rank 1 -> 2 and host 1's rank 3 -> 0.
  const double flat_ring = 2.0 * (kHosts * kPerHost - 1) / (kHosts * kPerHost) * kBytes;
  std::printf("allreduce of %zu MiB, %d hosts x %d ranks: bytes each host sent over its link\n", kBytes >> 20, kHosts,
              kPerHost);
  std::printf("  optimum 2(N-1)/N x S            %12.0f\n", optimum);
  for (int h = 0; h < kHosts; ++h) std::printf("  hier (measured), host %d         %12.0f (%.3f x optimum)\n", h,
                                               measured[0][h], measured[0][h] / optimum);
  for (int h = 0; h < kHosts; ++h) std::printf("  net_direct (measured), host %d   %12.0f (%.3f x optimum)\n", h,
                                               measured[1][h], measured[1][h] / optimum);
  std::printf("  flat ring over all ranks (computed) %8.0f (%.3f x optimum)\n", flat_ring, flat_ring / optimum);
  for (int h = 0; h < kHosts; ++h) {
    EXPECT_GE(measured[0][h], optimum * 0.99) << "host " << h;
    EXPECT_LE(measured[0][h], optimum * 1.10) << "host " << h << ": more than 10% above the optimum";
  }
}

}  // namespace
}  // namespace smddp::testing
