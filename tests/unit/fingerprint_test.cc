// Fingerprints (core/fingerprint.h): what ranks compare before a collective moves data. The
// memory kind is part of it: a rank on CUDA memory and a rank on host memory would open each
// other's buffers through different peer windows, so that pair must be a MismatchError.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace smddp::detail
