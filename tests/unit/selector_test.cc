// The selector's rules inside one node (algorithms/registry.cc): host memory by size and world,
// GPU memory to the single-copy window algorithms from SMDDP_CUDA_WINDOW_MIN up (and always for
// a rank alone), the staged ones below. The GPU rule's numbers come from an H100 (docs/gpu.md);
// here the rule itself is checked, since CI has no GPU.
#include <gtest/gtest.h>

#include <string>

#include "algorithms/registry.h"
#include "topology/topology.h"
#include "core/config.h"
#include "device/host_copy.h"

namespace smddp::algorithms {
namespace {

// `bytes`: all ranks' data, as CommunicatorImpl passes them.
std::string pick(CollKind k, size_t bytes, int world, bool gpu) {
  return select(k, bytes, world, {}, nullptr, gpu).name;
}

TEST(Selector, GpuMemoryTakesTheWindowAlgorithmsFromTheLimitUp) {
  const size_t limit = static_cast<size_t>(config::get_int("SMDDP_CUDA_WINDOW_MIN"));
  ASSERT_EQ(limit, size_t{1} << 20);
  for (CollKind k : {CollKind::allreduce, CollKind::allgather, CollKind::reduce_scatter}) {
    EXPECT_EQ(pick(k, limit, 2, true), "window") << to_string(k);
    EXPECT_EQ(pick(k, 256 << 20, 4, true), "window") << to_string(k);
    EXPECT_NE(pick(k, limit - 1, 2, true), "window") << to_string(k);
    EXPECT_EQ(pick(k, limit, 4, true), "window") << to_string(k) << ": the limit is on all ranks' data";
    EXPECT_NE(pick(k, limit - 4, 4, true), "window") << to_string(k);
    EXPECT_EQ(pick(k, 8, 1, true), "window") << to_string(k) << ": a rank alone copies on the GPU";
    // Host memory keeps its own rules (the window algorithms over CMA measured slower there).
    EXPECT_NE(pick(k, 256 << 20, 4, false), "window") << to_string(k);
  }
  EXPECT_EQ(pick(CollKind::allreduce, 8, 2, true), "one_shot");
  EXPECT_EQ(pick(CollKind::allreduce, 512 << 10, 2, true), "rs_ag");
  // Collectives without a window algorithm are not affected by the memory kind.
  EXPECT_EQ(pick(CollKind::broadcast, 256 << 20, 2, true), pick(CollKind::broadcast, 256 << 20, 2, false));
}

TEST(Selector, AnOverrideStillWinsOnGpuMemory) {
  const std::vector<const Algorithm*> forced = parse_overrides("allreduce:rs_ag,allgather:direct");
  EXPECT_STREQ(select(CollKind::allreduce, 256 << 20, 2, forced, nullptr, true).name, "rs_ag");
  EXPECT_STREQ(select(CollKind::allgather, 256 << 20, 2, forced, nullptr, true).name, "direct");
}

// Host memory inside one node whose ranks each have a CPU (own_cpus): the window algorithms over
// CMA in the sizes where they measured faster at 2 ranks, the staged ones elsewhere.
TEST(Selector, HostMemoryAtTwoRanksWithACpuEachTakesTheWindowAlgorithmsInTheirSizes) {
  ASSERT_EQ(host_window_mode(), "auto") << "run without SMDDP_HOST_WINDOW set";
  auto host = [](CollKind k, size_t bytes, int world, bool own_cpus) {
    return std::string(select(k, bytes, world, {}, nullptr, false, own_cpus).name);
  };
  constexpr size_t KiB = 1024, MiB = 1024 * KiB;
  struct Band {
    CollKind kind;
    size_t min, max;
    const char* staged;
  };
  for (const Band& b : {Band{CollKind::allreduce, 1 * MiB, 16 * MiB, "rs_ag"},
                        Band{CollKind::allgather, 256 * KiB, 32 * MiB, "direct"}}) {
    const char* k = to_string(b.kind);
    EXPECT_EQ(host(b.kind, b.min, 2, true), "window") << k;
    EXPECT_EQ(host(b.kind, b.max, 2, true), "window") << k;
    EXPECT_EQ(host(b.kind, b.min - 4, 2, true), b.staged) << k;
    EXPECT_EQ(host(b.kind, b.max + 4, 2, true), b.staged) << k;
    EXPECT_EQ(host(b.kind, b.min, 2, false), b.staged) << k << ": more ranks than CPUs";
    EXPECT_EQ(host(b.kind, b.min, 4, true), b.staged) << k << ": measured at 2 ranks only";
    EXPECT_EQ(host(b.kind, b.min, 1, true), b.kind == CollKind::allreduce ? "one_shot" : b.staged) << k;
  }
  EXPECT_EQ(host(CollKind::broadcast, 8 * MiB, 2, true), "direct");
  // The staged reduce_scatter won at every size once its slot stores were chosen (session 61);
  // without non-temporal stores (off x86-64) it keeps the band of 1-16 MiB.
  for (size_t bytes : {256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB}) {
    const bool band = !device::streaming_stores_built() && bytes >= 1 * MiB && bytes <= 16 * MiB;
    EXPECT_EQ(host(CollKind::reduce_scatter, bytes, 2, true), band ? "window" : "direct") << bytes;
  }
  // An override still wins.
  const std::vector<const Algorithm*> forced = parse_overrides("allreduce:rs_ag");
  EXPECT_STREQ(select(CollKind::allreduce, 8 * MiB, 2, forced, nullptr, false, true).name, "rs_ag");
}

// A rank lets its node's peers read its memory (PR_SET_PTRACER_ANY under Yama) only where some
// algorithm may read it: not with SMDDP_HOST_WINDOW=off and SMDDP_SHM_STEAL=0, unless an
// override forces a window algorithm (docs/security.md).
TEST(Selector, PeersMayReadHostMemoryUnlessNoAlgorithmWould) {
  EXPECT_TRUE(host_reads_possible("auto", false, {}));
  EXPECT_TRUE(host_reads_possible("any", false, {}));
  EXPECT_FALSE(host_reads_possible("off", false, {}));
  EXPECT_TRUE(host_reads_possible("off", true, {}));  // a late rank's round writes its output
  EXPECT_FALSE(host_reads_possible("off", false, parse_overrides("allreduce:rs_ag,allgather:direct")));
  EXPECT_TRUE(host_reads_possible("off", false, parse_overrides("allreduce:rs_ag,allgather:window")));
}

#ifdef SMDDP_HAVE_LIBFABRIC
// Across nodes, a forced hierarchical algorithm runs only where every node has as many ranks: on
// nodes of 2 and 1 ranks it read peers that do not exist (found by review); the override is
// ignored there, as registry.h says of one that does not fit the topology, and net_direct runs.
TEST(Selector, AForcedHierarchicalAlgorithmIsIgnoredOnUnevenNodes) {
  topology::Topology uneven;
  uneven.size = 3;
  uneven.node_of = {0, 0, 1};
  uneven.node_ranks = {{0, 1}, {2}};
  topology::Topology even = uneven;
  even.size = 4;
  even.node_of = {0, 0, 1, 1};
  even.node_ranks = {{0, 1}, {2, 3}};
  for (const char* spec : {"allreduce:hier", "allreduce:hier_small", "allgather:hier", "reduce_scatter:hier"}) {
    const std::vector<const Algorithm*> forced = parse_overrides(spec);
    const CollKind k = forced[0]->kind;
    EXPECT_STREQ(select(k, 1 << 20, 3, forced, &uneven).name, "net_direct") << spec;
    EXPECT_STREQ(select(k, 1 << 20, 4, forced, &even).name, forced[0]->name) << spec;
  }
}
#endif

}  // namespace
}  // namespace smddp::algorithms
