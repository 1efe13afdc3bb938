// Every node algorithm of the registry on an asynchronous device: copies and reductions are
// queued to a worker thread (a stream) and land late, as on a GPU. An algorithm that tells its
// peers a round is done before its device work landed lets them read stale slots and outputs;
// Context::arrive() fences the device first, and this test fails when that fence is missing
// (checked by removing it). The single-copy algorithms run on a mapped arena (the IPC shape), so
// this is the configuration GPUs will run, on CPUs. Cases come from the registry: a new node
// algorithm is tested here the day it is registered.
#include <gtest/gtest.h>

#include <string>

#include "algorithms/scratch_pool.h"
#include "collective/algorithm_cases.h"
#include "collective/late_device.h"
#include "collective/mapped_windows.h"

namespace smddp::testing {
namespace {

class AsyncDevice : public ::testing::TestWithParam<int> {};

TEST_P(AsyncDevice, EveryNodeAlgorithmFencesBeforeItsPeersRead) {
  auto res = run_ranks(GetParam(), [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    MappedWindows arena(16 << 20);
    shm::GroupConfig cfg;
    cfg.slot_bytes = 4096;  // 1024 floats: the larger counts take several chunks
    shm::Group g(*store, rank, w, cfg, std::chrono::seconds(120));
    LateDevice late;
    const int ran = run_every_node_algorithm(g, late, arena, &arena, rep);
    if (ran < 13) rep.fail("only " + std::to_string(ran) + " node algorithms registered: the registry shrank?");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// The staged allreduce and reduce with slots in parts (SMDDP_SHM_AHEAD): the fast ranks run up
// to parts - 1 rounds ahead of rank 0, whose device lands every copy and reduction 300 us late,
// so a part rewritten before the slow rank finished reading it (a wait that let a rank run one
// round further ahead) shows as a wrong element. Every other node algorithm runs between them, so
// the boundaries between collectives that use parts and ones that do not are crossed both ways.
TEST_P(AsyncDevice, StagedAllreduceRunsAheadOfALateRankWithoutOverwritingWhatItReads) {
  for (const int parts : {2, 3}) {
    auto res = run_ranks(GetParam(), [parts](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
      MappedWindows arena(16 << 20);
      shm::GroupConfig cfg;
      cfg.slot_bytes = 4096;  // 1024 floats: 12000 of them take 12 chunks, 40000 take 40
      cfg.slot_parts = parts;
      shm::Group g(*store, rank, w, cfg, std::chrono::seconds(120));
      LateDevice late;
      device::Device& dev = rank == 0 ? static_cast<device::Device&>(late) : device::host();
      run_every_node_algorithm(g, dev, arena, &arena, rep, {2500, 12000, 40000, 1});
      if (!rep.ok()) rep.fail("with " + std::to_string(parts) + " slot parts");
    });
    ASSERT_TRUE(res.ok()) << res.summary();
  }
}

INSTANTIATE_TEST_SUITE_P(World, AsyncDevice, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "w" + std::to_string(i.param); });

}  // namespace
}  // namespace smddp::testing
