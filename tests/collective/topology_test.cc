// Node discovery through the store: SMDDP_NODE_ID groups ranks into pretend nodes; without it,
// all ranks of this machine are one node.
#include <gtest/gtest.h>

#include "collective/harness.h"
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

TEST(Topology, SameMachineIsOneNode) {
  auto res = run_ranks(3, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    auto t = topology::discover(*store, rank, w, std::chrono::seconds(30));
    if (t.num_nodes() != 1 || t.local_size() != 3) rep.fail(t.describe());
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

}  // namespace
}  // namespace smddp::testing
