// The selector's rules inside one node (algorithms/registry.cc): host memory by size and world,
// GPU memory to the single-copy window algorithms from SMDDP_CUDA_WINDOW_MIN up (and always for
// a rank alone), the staged ones below. The GPU rule's numbers come from an H100 (docs/gpu.md);
// here the rule itself is checked, since CI has no GPU.
#include <gtest/gtest.h>

#include <string>

#include "algorithms/registry.h"
#include "core/config.h"

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

}  // namespace
}  // namespace smddp::algorithms
