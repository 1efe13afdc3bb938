// Node discovery through the store: SMDDP_NODE_ID groups ranks into pretend nodes; without it,
// all ranks of this machine are one node.
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "collective/harness.h"
#include "smddp/communicator.h"
#include "topology/topology.h"

namespace smddp::testing {
namespace {

TEST(Topology, NodeIdsGroupRanksAndLocalRanksFollow) {
  RunOptions ro;
  ro.rank_env = {{{"SMDDP_NODE_ID", "b"}}, {{"SMDDP_NODE_ID", "a"}}, {{"SMDDP_NODE_ID", "b"}},
                 {{"SMDDP_NODE_ID", "a"}}, {{"SMDDP_NODE_ID", "b"}}};
  auto res = run_ranks(5, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    auto t = topology::discover(*store, rank, w, std::chrono::seconds(30));
    // Node 0 is the node of rank 0 ("b": ranks 0 2 4), node 1 is "a" (ranks 1 3).
    const std::vector<std::vector<int>> want = {{0, 2, 4}, {1, 3}};
    if (t.node_ranks != want) rep.fail("node ranks: " + t.describe());
    if (t.node() != rank % 2) rep.fail("node of rank " + std::to_string(rank));
    if (t.local_rank() != rank / 2) rep.fail("local rank " + std::to_string(t.local_rank()));
    if (t.leader() != rank % 2) rep.fail("leader " + std::to_string(t.leader()));
    const auto peers = t.peers_across_nodes();
    const std::vector<int> want_peers = rank == 4 ? std::vector<int>{4} : std::vector<int>{rank - rank % 2, rank - rank % 2 + 1};
    if (peers != want_peers) rep.fail("peers across nodes of rank " + std::to_string(rank));
    if (t.describe().find("2 nodes: node 0 (b) ranks 0 2 4, node 1 (a) ranks 1 3") == std::string::npos)
      rep.fail("describe: " + t.describe());
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

// A layout of nodes (ranks numbered node by node) seen from `rank`.
topology::Topology layout(const std::vector<int>& sizes, int rank) {
  topology::Topology t;
  t.rank = rank;
  for (int n = 0, next = 0; n < static_cast<int>(sizes.size()); ++n) {
    t.node_ranks.emplace_back();
    for (int i = 0; i < sizes[static_cast<size_t>(n)]; ++i, ++next) {
      t.node_ranks.back().push_back(next);
      t.node_of.push_back(n);
    }
  }
  t.size = static_cast<int>(t.node_of.size());
  return t;
}

// What the cross-node fingerprint check relies on: the pairing is symmetric (both sides of a
// pair post the exchange) and pairs every rank with some rank of every other node (so every
// node hears of a disagreeing rank anywhere), for even, uneven and single-rank nodes.
TEST(Topology, AgreementPartnersAreSymmetricAndCoverEveryNode) {
  const std::vector<std::vector<int>> layouts = {{2, 2}, {1, 1}, {3, 2}, {2, 3}, {1, 4}, {3, 2, 1}, {8, 8, 8}, {5, 3, 7, 1}};
  for (const auto& sizes : layouts) {
    const int world = layout(sizes, 0).size;
    std::vector<std::vector<int>> partners;
    for (int r = 0; r < world; ++r) partners.push_back(layout(sizes, r).agreement_partners());
    for (int a = 0; a < world; ++a) {
      const auto t = layout(sizes, a);
      std::vector<int> nodes_met;
      for (int b : partners[static_cast<size_t>(a)]) {
        EXPECT_NE(t.node_of[static_cast<size_t>(b)], t.node()) << "rank " << a << " paired with its own node's " << b;
        const auto& back = partners[static_cast<size_t>(b)];
        EXPECT_NE(std::find(back.begin(), back.end(), a), back.end()) << "rank " << a << " pairs with " << b << ", not back";
        nodes_met.push_back(t.node_of[static_cast<size_t>(b)]);
      }
      for (int m = 0; m < t.num_nodes(); ++m) {
        if (m == t.node()) continue;
        EXPECT_NE(std::find(nodes_met.begin(), nodes_met.end(), m), nodes_met.end())
            << "rank " << a << " has no partner on node " << m << " (layout of " << sizes.size() << " nodes)";
      }
    }
  }
  // Even nodes pair like the hierarchical algorithms' peers: one partner per other node.
  EXPECT_EQ(layout({4, 4, 4}, 5).agreement_partners(), (std::vector<int>{1, 9}));
}

// Pretend nodes on one machine share its kernel and cores: a rank counts every rank of the
// communicator on its kernel, and the CPUs they may run on together, not its node's size
// (docs/performance.md, between nodes: spinning as if each pretend node had cores of its own
// took the cores of the ranks it waited for). A fourth rank's record, published here for it,
// says it runs on another kernel with 64 CPUs: it is a node, but neither its rank nor its CPUs
// count here.
TEST(Topology, RanksOfEveryNodeOnThisKernelCountAgainstTheUnionOfTheirCpus) {
  std::vector<int> allowed;  // this process's CPUs (a container's cpuset need not start at 0)
  cpu_set_t parent;
  ASSERT_EQ(sched_getaffinity(0, sizeof parent, &parent), 0);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &parent)) allowed.push_back(c);
  ASSERT_FALSE(allowed.empty());
  for (const bool one_cpu : {false, true}) {
    RunOptions ro;
    ro.rank_env = {{{"SMDDP_NODE_ID", "a"}}, {{"SMDDP_NODE_ID", "a"}}, {{"SMDDP_NODE_ID", "b"}}};
    auto res = run_ranks(3, [&](int rank, int, std::shared_ptr<Store> store, Report& rep) {
      // Each rank on a CPU of its own (as mpirun --bind-to core does), or all on the first.
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(allowed[one_cpu ? 0 : static_cast<size_t>(rank) % allowed.size()], &set);
      if (sched_setaffinity(0, sizeof set, &set) != 0) return rep.fail("sched_setaffinity");
      const std::string other = "another-boot-id 0-63 id:elsewhere";
      store->set("topo/node/3", std::vector<uint8_t>(other.begin(), other.end()));
      auto t = topology::discover(*store, rank, 4, std::chrono::seconds(30));
      const int want_cpus = one_cpu ? 1 : static_cast<int>(std::min<size_t>(allowed.size(), 3));
      if (t.num_nodes() != 3) rep.fail("nodes: " + t.describe());
      if (t.kernel_ranks != 3) rep.fail("kernel ranks " + std::to_string(t.kernel_ranks) + ": " + t.describe());
      if (t.kernel_cpus != want_cpus) rep.fail("kernel cpus " + std::to_string(t.kernel_cpus) + ": " + t.describe());
      if (t.oversubscribed() != (3 > want_cpus)) rep.fail("oversubscribed: " + t.describe());
      if (t.describe().find("; 3 ranks on this kernel sharing " + std::to_string(want_cpus)) == std::string::npos)
        rep.fail("describe: " + t.describe());
    }, ro);
    ASSERT_TRUE(res.ok()) << (one_cpu ? "all on one CPU: " : "a CPU each: ") << res.summary();
  }
}

// A record that is not one (another version's, or garbage in a reused store) is an error that
// names whose it is, not a silent guess.
TEST(Topology, MalformedRecordIsAnErrorNamingItsRank) {
  auto res = run_ranks(1, [](int rank, int, std::shared_ptr<Store> store, Report& rep) {
    const std::string bad = "host:boot";
    store->set("topo/node/1", std::vector<uint8_t>(bad.begin(), bad.end()));
    try {
      topology::discover(*store, rank, 2, std::chrono::seconds(5));
      rep.fail("no error for a malformed record");
    } catch (const InvalidArgument& e) {
      if (std::string(e.what()).find("rank 1's topology record is malformed") == std::string::npos)
        rep.fail(std::string("message: ") + e.what());
    }
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// What a record carries across ranks: CPU sets as ranges, and nothing from text that is not one.
TEST(Topology, CpuRangesRoundTrip) {
  const std::vector<std::vector<int>> sets = {{0}, {0, 1}, {0, 1, 2, 3, 8}, {1, 3, 5}, {4, 5, 6, 10, 11, 63}};
  for (const auto& cpus : sets) EXPECT_EQ(topology::parse_cpu_ranges(topology::cpu_ranges(cpus)), cpus);
  EXPECT_EQ(topology::cpu_ranges({0, 1, 2, 3, 8}), "0-3,8");
  for (const char* bad : {"x", "1-", "-1", "3-1", "1,,2", "1-2-3", "2x"})
    EXPECT_TRUE(topology::parse_cpu_ranges(bad).empty()) << bad;
}

TEST(Topology, SameMachineIsOneNode) {
  auto res = run_ranks(3, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    auto t = topology::discover(*store, rank, w, std::chrono::seconds(30));
    if (t.num_nodes() != 1 || t.local_size() != 3) rep.fail(t.describe());
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// A rank that sees another /dev/shm than its peers on the same kernel and host name (a container
// of its own on the host's network) is on another node: it cannot share memory with them. They
// were one node, and the rank that could not open the node's segment failed after the timeout.
TEST(Topology, ARankWithADevShmOfItsOwnIsAnotherNode) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to mount a /dev/shm of its own in a private mount namespace";
  auto res = run_ranks(3, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    if (rank == 2 && (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
                      ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=64m") != 0))
      return rep.fail(std::string("no private /dev/shm: ") + std::strerror(errno));
    auto t = topology::discover(*store, rank, w, std::chrono::seconds(30));
    const size_t want_local = rank == 2 ? 1 : 2;
    if (t.num_nodes() != 2 || static_cast<size_t>(t.local_size()) != want_local) rep.fail(t.describe());
#ifdef SMDDP_HAVE_LIBFABRIC
    // And a communicator of them runs, across its two "nodes".
    Options o;
    o.name = "own-dev-shm";
    o.timeout = std::chrono::seconds(60);
    Communicator c(store, rank, w, o);
    float f = static_cast<float>(rank + 1);
    c.allreduce(&f, &f, 1, DataType::f32, ReduceOp::sum).wait();
    if (f != 6.0f) rep.fail("allreduce gave " + std::to_string(f));
#endif
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// The local rank a communicator's traffic between nodes picks its NIC by, and which a group made
// from its ranks inherits (torch's split_group, python/csrc/backend_split.cc): the process's place
// among the communicator's ranks on its node, unless Options::local_rank names it.
TEST(Topology, ProcessLocalRankIsTheNodesPlaceUnlessTheOptionsNameIt) {
  RunOptions ro;
#ifdef SMDDP_HAVE_LIBFABRIC
  ro.env = {{"FI_TCP_IFACE", "lo"}};  // two pretend nodes: ranks 0 2 on "b", 1 3 on "a"
  ro.rank_env = {{{"SMDDP_NODE_ID", "b"}}, {{"SMDDP_NODE_ID", "a"}}, {{"SMDDP_NODE_ID", "b"}},
                 {{"SMDDP_NODE_ID", "a"}}};
  const int per_node = 2;
#else
  const int per_node = 4;  // one node: a build without libfabric cannot span two
#endif
  auto res = run_ranks(4, [&](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.timeout = std::chrono::seconds(60);
    Communicator world(store, rank, w, o);
    const int want = per_node == 2 ? rank / 2 : rank;
    if (world.process_local_rank() != want)
      rep.fail("world: " + std::to_string(world.process_local_rank()) + ", want " + std::to_string(want));
    o.name = "named";
    o.local_rank = 5 + rank;
    Communicator named(store, rank, w, o);
    if (named.process_local_rank() != 5 + rank) rep.fail("named: " + std::to_string(named.process_local_rank()));
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

}  // namespace
}  // namespace smddp::testing
