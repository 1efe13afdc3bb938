// Taking a late rank's round (#18, SMDDP_SHM_STEAL; docs/algorithms.md): in the staged allreduce
// and reduce on host memory, a rank that waits for a late node-mate may do that rank's next
// round for it through cross-memory attach. Here the late rank is made late the way a busy
// machine does it, by a process that stops it (SIGSTOP, as a descheduled process: alive, its
// last arrival published, not running) for a few milliseconds at a time while it waits.
// Checked: every element against a plain loop over every rank's input, that rounds were taken
// (with the setting on) or never (off), and that a rank that does not expose its buffers (the
// setting off on it alone) has its rounds done by itself only, with the results still right.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/registry.h"
#include "algorithms/scratch_pool.h"
#include "collective/direct_op.h"
#include "collective/harness.h"
#include "device/peer_window.h"
#include "transport/shm/shm_group.h"

namespace smddp::testing {
namespace {

using namespace std::chrono_literals;
using algorithms::CollArgs;
using algorithms::CollKind;

// Small integers: every sum is exact in f32, so the check needs no tolerance and a segment
// reduced twice, or copied from the wrong round, shows.
float value(int rank, size_t i, int iter) { return static_cast<float>((rank + 1) * ((i + iter) % 61)); }

// While alive, stops rank `late` for 3 ms whenever it waits for a node-mate (its published step
// is past another rank's: it arrived and cannot start its next round), then leaves it 1 ms to
// run; continues it when destroyed. Stopped there, it is the rank a busy machine leaves off its
// core after the wake-up: its round is due and it is not running. Stopped anywhere else it would
// hold a round it claimed, which nobody may take.
class Stopper {
 public:
  Stopper(shm::Group& g, int late) : g_(g), late_(late), pid_(g.pid_of(late)), t_([this] { loop(); }) {}
  ~Stopper() {
    done_ = true;
    t_.join();
    ::kill(pid_, SIGCONT);
  }

 private:
  bool late_waits() const {
    const uint64_t s = g_.step_of(late_);
    for (int r = 0; r < g_.size(); ++r)
      if (r != late_ && static_cast<int64_t>(s - g_.step_of(r)) > 0) return true;
    return false;
  }
  void loop() {
    while (!done_.load()) {
      if (!late_waits()) {
        std::this_thread::sleep_for(20us);
        continue;
      }
      ::kill(pid_, SIGSTOP);
      std::this_thread::sleep_for(3ms);
      ::kill(pid_, SIGCONT);
      std::this_thread::sleep_for(1ms);
    }
  }
  shm::Group& g_;
  int late_, pid_;
  std::atomic<bool> done_{false};
  std::thread t_;
};

struct Case {
  int world;
  int ahead;       // SMDDP_SHM_AHEAD: 0 lock-step (L = 1), 1 (L = 2)
  int root;        // -1: allreduce; else reduce to this rank
};

// Runs 30 collectives of 400000 floats (98 chunks of 4096-float slots: 99 rounds or more) on
// `c.world` ranks while rank world-1 is stopped again and again; records each rank's taken rounds.
RunResult run_with_late_rank(const Case& c, bool take_on_late_rank, bool take_on_others) {
  return run_ranks(c.world, [=](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    const int late = w - 1;
    shm::GroupConfig cfg;
    cfg.slot_bytes = 16384;
    cfg.slot_parts = c.ahead + 1;
    cfg.take_rounds = rank == late ? take_on_late_rank : take_on_others;
    shm::Group g(*store, rank, w, cfg, std::chrono::seconds(60));
    auto win = device::cma_windows([&g](int r) { return g.pid_of(r); });
    algorithms::ScratchPool scratch;
    const size_t count = 400000;
    std::vector<float> in(count), out(count);
    {
      std::unique_ptr<Stopper> stopper;
      if (rank == 0) stopper = std::make_unique<Stopper>(g, late);
      for (int iter = 0; iter < 30 && rep.ok(); ++iter) {
        for (size_t i = 0; i < count; ++i) in[i] = value(rank, i, iter);
        std::fill(out.begin(), out.end(), -1.0f);
        OpInfo op = op_for(c.root < 0 ? "allreduce" : "reduce", rank, w);
        algorithms::Context ctx{g, device::host(), op, nullptr, nullptr, nullptr, &scratch, win.get()};
        CollArgs a;
        a.kind = c.root < 0 ? CollKind::allreduce : CollKind::reduce;
        a.send = in.data(), a.recv = c.root < 0 || c.root == rank ? out.data() : nullptr, a.count = count;
        a.op = Reduction{ReduceOp::sum}, a.root = c.root < 0 ? 0 : c.root;
        if (c.root < 0) algorithms::find(CollKind::allreduce, "rs_ag").run(ctx, a);
        else algorithms::find(CollKind::reduce, "direct").run(ctx, a);
        if (a.recv == nullptr) continue;
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < w; ++r) want += value(r, i, iter);
          if (out[i] != want) {
            rep.fail("collective " + std::to_string(iter) + ": element " + std::to_string(i) + " is " +
                     std::to_string(out[i]) + ", expected " + std::to_string(want));
            break;
          }
        }
      }
    }
    rep.record("taken", std::to_string(g.rounds_taken()));
  });
}

uint64_t taken_by(const RunResult& res, int rank) {
  for (const auto& [k, v] : res.ranks[static_cast<size_t>(rank)].records)
    if (k == "taken") return std::stoull(v);
  return 0;
}

class RoundTaking : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTaking, NodeMatesDoAStoppedRanksRoundsAndTheResultIsExact) {
  if (cma_missing_here()) GTEST_SKIP() << "no cross-memory attach on this kernel (qemu-user)";
  const Case c = GetParam();
  auto res = run_with_late_rank(c, true, true);
  ASSERT_TRUE(res.ok()) << res.summary();
  uint64_t taken = 0;
  for (int r = 0; r < c.world; ++r) taken += taken_by(res, r);
  // Stopped for 3 ms whenever it waits, across some 3000 rounds: peers that wait 50 us take them.
  EXPECT_GT(taken, 0u) << "no rank took a round of the stopped rank";
}

TEST_P(RoundTaking, NoRoundIsTakenWithTheSettingOff) {
  if (cma_missing_here()) GTEST_SKIP() << "no cross-memory attach on this kernel (qemu-user)";
  const Case c = GetParam();
  auto res = run_with_late_rank(c, false, false);
  ASSERT_TRUE(res.ok()) << res.summary();
  for (int r = 0; r < c.world; ++r) EXPECT_EQ(taken_by(res, r), 0u) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Cases, RoundTaking,
                         ::testing::Values(Case{2, 0, -1}, Case{3, 0, -1}, Case{3, 1, -1}, Case{4, 1, -1},
                                           Case{3, 0, 1}, Case{3, 1, 2}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "w" + std::to_string(i.param.world) + "_ahead" + std::to_string(i.param.ahead) +
                                  (i.param.root < 0 ? std::string("_allreduce")
                                                    : "_reduce_to_" + std::to_string(i.param.root));
                         });

// The stopped rank does not expose its buffers (SMDDP_SHM_STEAL=0 on it alone): its peers, with
// the setting on, must not touch it (they would read descriptors of another collective), so its
// rounds are its own; the results stay exact.
TEST(RoundTakingMixed, ARankWithTheSettingOffKeepsItsRounds) {
  if (cma_missing_here()) GTEST_SKIP() << "no cross-memory attach on this kernel (qemu-user)";
  auto res = run_with_late_rank(Case{2, 1, -1}, false, true);
  ASSERT_TRUE(res.ok()) << res.summary();
  // Two ranks: the only rank whose rounds rank 0 could take is the stopped one.
  EXPECT_EQ(taken_by(res, 0), 0u);
}

}  // namespace
}  // namespace smddp::testing
