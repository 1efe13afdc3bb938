// Fingerprints (core/fingerprint.h): what ranks compare before a collective moves data. The
// memory kind is part of it: a rank on CUDA memory and a rank on host memory would open each
// other's buffers through different peer windows, so that pair must be a MismatchError.
#include <gtest/gtest.h>

#include "algorithms/registry.h"
#include "core/fingerprint.h"

namespace smddp::detail {
namespace {

algorithms::CollArgs allreduce(Memory m) {
  algorithms::CollArgs a;
  a.kind = algorithms::CollKind::allreduce;
  a.count = 16;
  a.memory = m;
  return a;
}

TEST(Fingerprint, MemoryKindIsComparedAndNamed) {
  const auto host = fingerprint(3, allreduce(Memory{})), gpu0 = fingerprint(3, allreduce(Memory::cuda(0))),
             gpu1 = fingerprint(3, allreduce(Memory::cuda(1)));
  EXPECT_NE(host, gpu0);
  EXPECT_EQ(gpu0, gpu1) << "ranks on different GPUs of a node run one collective together";
  EXPECT_EQ(describe(host), "allreduce(f32, 16 elements, sum) as collective #3");
  EXPECT_EQ(describe(gpu0), "allreduce(f32, 16 elements, sum, CUDA memory) as collective #3");
}

// Across nodes a collective on CUDA memory may be staged in pieces (core/host_staging.h): ranks
// that would cut it differently must not run it, and the clause names the setting.
TEST(Fingerprint, StagingPiecesAreComparedAndNamed) {
  const auto whole = fingerprint(3, allreduce(Memory::cuda(0)));
  const auto cut = fingerprint(3, allreduce(Memory::cuda(0)), nullptr, 4);
  const auto other = fingerprint(3, allreduce(Memory::cuda(0)), nullptr, 8);
  EXPECT_NE(whole, cut);
  EXPECT_NE(cut, other);
  EXPECT_EQ(describe(cut),
            "allreduce(f32, 16 elements, sum, staged in pieces of 4 elements a block (SMDDP_CUDA_STAGING_PIECE), CUDA "
            "memory) as collective #3");
}

// The algorithm is compared; a clause names it only where another clause differs from it in
// the algorithm alone (here ranks 0 and 1; rank 2 differs in count, and its clause does not).
TEST(Fingerprint, AlgorithmIsComparedAndNamedWhereItIsTheDifference) {
  // Pointers, not references: GCC 14 takes a reference to find()'s result, called with a
  // temporary string, for a possibly dangling one (-Wdangling-reference).
  const algorithms::Algorithm* rs_ag = &algorithms::find(algorithms::CollKind::allreduce, "rs_ag");
  const algorithms::Algorithm* one_shot = &algorithms::find(algorithms::CollKind::allreduce, "one_shot");
  auto other_count = allreduce(Memory{});
  other_count.count = 32;
  const std::vector<Fingerprint> all = {fingerprint(3, allreduce(Memory{}), rs_ag),
                                        fingerprint(3, allreduce(Memory{}), one_shot),
                                        fingerprint(3, other_count, rs_ag)};
  EXPECT_NE(all[0], all[1]);
  EXPECT_EQ(describe_disagreement(all, {}),
            "rank 0 called allreduce(f32, 16 elements, sum) as collective #3 with algorithm rs_ag; "
            "rank 1 called allreduce(f32, 16 elements, sum) as collective #3 with algorithm one_shot; "
            "rank 2 called allreduce(f32, 32 elements, sum) as collective #3 (each rank picks the algorithm "
            "from its own SMDDP_* settings and Options::algorithms: they must agree)");
  // Without an algorithm difference nothing about algorithms is said.
  EXPECT_EQ(describe_disagreement({all[0], all[2]}, {}),
            "rank 0 called allreduce(f32, 16 elements, sum) as collective #3; "
            "rank 1 called allreduce(f32, 32 elements, sum) as collective #3");
}

}  // namespace
}  // namespace smddp::detail
