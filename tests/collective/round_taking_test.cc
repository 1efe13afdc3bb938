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
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/registry.h"
#include "algorithms/scratch_pool.h"
#include "collective/direct_op.h"
#include "collective/harness.h"
#include "device/peer_window.h"
#include "smddp/errors.h"
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
//
// Once destroyed it sets kStopperGone, which the late rank waits for before it leaves its
// collectives (after its loop). Without that wait a last SIGSTOP/SIGCONT could reach it in the
// harness's leak check: LeakSanitizer's tracer attaches with ptrace and waits for the stop the
// attach makes, our SIGCONT ended that stop unseen, and tracer and rank waited on each other
// until the harness's 600 s limit (the sanitize step's RoundTaking "hangs", 2 of 12 in one CI run;
// caught here with the tracer in wait4 and the rank spinning in sched_yield).
constexpr const char* kStopperGone = "round-taking-stopper-gone";
class Stopper {
 public:
  Stopper(shm::Group& g, int late, Store& store)
      : g_(g), late_(late), pid_(g.pid_of(late)), store_(store), t_([this] { loop(); }) {}
  ~Stopper() {
    done_ = true;
    t_.join();
    ::kill(pid_, SIGCONT);
    store_.set(kStopperGone, {1});
  }
  int stops() const { return stops_.load(); }

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
      ++stops_;
      std::this_thread::sleep_for(3ms);
      ::kill(pid_, SIGCONT);
      std::this_thread::sleep_for(1ms);
    }
  }
  shm::Group& g_;
  int late_, pid_;
  Store& store_;
  std::atomic<bool> done_{false};
  std::atomic<int> stops_{0};
  std::thread t_;
};

struct Case {
  int world;
  int ahead;       // SMDDP_SHM_AHEAD: 0 lock-step (L = 1), 1 (L = 2)
  int root;        // -1: allreduce; else reduce to this rank
};

// CMA windows whose write() (used only to do a node-mate's round: its output) first calls
// `before_write`: a fault injected into a rank that is doing another's round.
class InjectingWindows final : public device::PeerWindows {
 public:
  InjectingWindows(std::unique_ptr<device::PeerWindows> inner, std::function<void()> before_write)
      : inner_(std::move(inner)), before_write_(std::move(before_write)) {}
  const char* name() const override { return inner_->name(); }
  bool expose(const void* p, size_t bytes, std::byte* desc) override { return inner_->expose(p, bytes, desc); }
  device::PeerBuffer open(int peer, const std::byte* desc) override { return inner_->open(peer, desc); }
  bool reachable(int peer, const std::byte* desc, std::string* why) override {
    return inner_->reachable(peer, desc, why);
  }
  bool needs_probe() const override { return inner_->needs_probe(); }
  void read(const device::PeerBuffer& b, size_t offset, void* dst, size_t bytes, const OpInfo& op) override {
    inner_->read(b, offset, dst, bytes, op);
  }
  bool writable() const override { return true; }
  void write(const device::PeerBuffer& b, size_t offset, const void* src, size_t bytes, const OpInfo& op) override {
    before_write_();
    inner_->write(b, offset, src, bytes, op);
  }

 private:
  std::unique_ptr<device::PeerWindows> inner_;
  std::function<void()> before_write_;
};

// Whether `rank` takes rounds (GroupConfig::take_rounds), the last rank being the stopped one.
using Takes = std::function<bool(int rank, int late)>;
// Set: called in `rank`'s window before it writes a node-mate's output; the run then expects
// a failure, and each rank records what it caught ("error") and how long after its failing
// collective began ("error_ms").
using BeforeWrite = std::function<void(int rank)>;

// Runs 30 collectives of 400000 floats (98 chunks of 4096-float slots: 99 rounds or more) on
// `c.world` ranks while rank world-1 is stopped again and again; records each rank's taken rounds.
// The stopper looks for a waiting late rank every 20 us or so, and at w=2 under ASan one run of
// 30 caught it in none (no round taken, the test failed on its premise): past 30 the ranks go on,
// as rank 0 decides through the store, until it was stopped kMinStops times (at most 300).
constexpr int kMinStops = 5;
RunResult run_with_late_rank(const Case& c, const Takes& takes, const BeforeWrite& before_write = {}) {
  return run_ranks(c.world, [=](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    const int late = w - 1;
    shm::GroupConfig cfg;
    cfg.slot_bytes = 16384;
    cfg.slot_parts = c.ahead + 1;
    cfg.take_rounds = takes(rank, late);
    shm::Group g(*store, rank, w, cfg, std::chrono::seconds(60));
    std::unique_ptr<device::PeerWindows> win = device::cma_windows([&g](int r) { return g.pid_of(r); });
    if (before_write) win = std::make_unique<InjectingWindows>(std::move(win), [=] { before_write(rank); });
    algorithms::ScratchPool scratch;
    const size_t count = 400000;
    std::vector<float> in(count), out(count);
    std::unique_ptr<Stopper> stopper;
    if (rank == 0) stopper = std::make_unique<Stopper>(g, late, *store);
    const auto more = [&](int iter) {
      const std::string key = "round-taking-more-" + std::to_string(iter);
      if (rank == 0) {
        const bool go_on = stopper->stops() < kMinStops && iter < 300;
        store->set(key, {static_cast<uint8_t>(go_on)});
        return go_on;
      }
      return store->get(key, std::chrono::seconds(60)).at(0) != 0;
    };
    for (int iter = 0; rep.ok() && (iter < 30 || more(iter)); ++iter) {
      for (size_t i = 0; i < count; ++i) in[i] = value(rank, i, iter);
      std::fill(out.begin(), out.end(), -1.0f);
      OpInfo op = op_for(c.root < 0 ? "allreduce" : "reduce", rank, w);
      algorithms::Context ctx{g, device::host(), op, nullptr, nullptr, nullptr, &scratch, win.get()};
      CollArgs a;
      a.kind = c.root < 0 ? CollKind::allreduce : CollKind::reduce;
      a.send = in.data(), a.recv = c.root < 0 || c.root == rank ? out.data() : nullptr, a.count = count;
      a.op = Reduction{ReduceOp::sum}, a.root = c.root < 0 ? 0 : c.root;
      const auto began = std::chrono::steady_clock::now();
      try {
        if (c.root < 0) algorithms::find(CollKind::allreduce, "rs_ag").run(ctx, a);
        else algorithms::find(CollKind::reduce, "direct").run(ctx, a);
      } catch (const std::exception& e) {
        if (!before_write) throw;
        const char* kind = dynamic_cast<const PeerError*>(&e)      ? "PeerError"
                           : dynamic_cast<const AbortedError*>(&e) ? "AbortedError"
                                                                   : "other";
        rep.record_text("error", std::string(kind) + ": " + e.what());
        rep.record("error_ms", std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  std::chrono::steady_clock::now() - began)
                                                  .count()));
        break;
      }
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
    stopper.reset();
    if (rank == late) store->wait({kStopperGone}, std::chrono::seconds(60));  // see Stopper
    rep.record("taken", std::to_string(g.rounds_taken()));
  });
}

Takes everyone(bool on) {
  return [on](int, int) { return on; };
}

std::string record_of(const RunResult& res, int rank, const std::string& key) {
  for (const auto& [k, v] : res.ranks[static_cast<size_t>(rank)].records)
    if (k == key) return v;
  return "";
}
uint64_t taken_by(const RunResult& res, int rank) {
  const std::string v = record_of(res, rank, "taken");
  return v.empty() ? 0 : std::stoull(v);
}

class RoundTaking : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTaking, NodeMatesDoAStoppedRanksRoundsAndTheResultIsExact) {
  if (cma_missing_here()) GTEST_SKIP() << "no cross-memory attach on this kernel (qemu-user)";
  const Case c = GetParam();
  auto res = run_with_late_rank(c, everyone(true));
  ASSERT_TRUE(res.ok()) << res.summary();
  uint64_t taken = 0;
  for (int r = 0; r < c.world; ++r) taken += taken_by(res, r);
  // Stopped for 3 ms whenever it waits, across some 3000 rounds: peers that wait 50 us take them.
  EXPECT_GT(taken, 0u) << "no rank took a round of the stopped rank";
}

TEST_P(RoundTaking, NoRoundIsTakenWithTheSettingOff) {
  if (cma_missing_here()) GTEST_SKIP() << "no cross-memory attach on this kernel (qemu-user)";
  const Case c = GetParam();
  auto res = run_with_late_rank(c, everyone(false));
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
  auto res = run_with_late_rank(Case{2, 1, -1}, [](int rank, int late) { return rank != late; });
  ASSERT_TRUE(res.ok()) << res.summary();
  // Two ranks: the only rank whose rounds rank 0 could take is the stopped one.
  EXPECT_EQ(taken_by(res, 0), 0u);
}

// A rank whose copy fails while doing a node-mate's round aborts the node's communicator with
// its reason: the owner waits for that round, and would otherwise wait until its deadline.
TEST(RoundTakingFailure, ATakerWhoseCopyFailsAbortsWithItsReason) {
  if (cma_missing_here()) GTEST_SKIP() << "no cross-memory attach on this kernel (qemu-user)";
  // Rank 0 takes no rounds, so rank 1 does the stopped rank 2's; rank 2 exposes its buffers
  // (the setting on) and may take too, but only rank 1's copies fail.
  auto res = run_with_late_rank(Case{3, 0, -1}, [](int rank, int) { return rank != 0; }, [](int rank) {
    if (rank == 1) throw SystemError("smddp: injected write failure");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
  print_records(res, "error");
  EXPECT_NE(record_of(res, 1, "error").find("injected_write_failure"), std::string::npos)
      << record_of(res, 1, "error");
  for (int r : {0, 2}) {
    const std::string e = record_of(res, r, "error");
    EXPECT_NE(e.find("AbortedError"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("failed_doing_rank_2's_round"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("injected"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_LT(std::stoll(record_of(res, r, "error_ms")), 5000) << "rank " << r;
  }
}

// A rank killed while doing a node-mate's round (it claimed the round, never published it): the
// owner, which waits for the round, and the others learn it within tens of milliseconds, not
// at their 60 s deadline, naming the dead rank.
TEST(RoundTakingFailure, ATakerKilledInItsRoundIsReportedFast) {
  if (cma_missing_here()) GTEST_SKIP() << "no cross-memory attach on this kernel (qemu-user)";
  auto res = run_with_late_rank(Case{3, 0, -1}, [](int rank, int) { return rank != 0; }, [](int rank) {
    if (rank == 1) ::kill(::getpid(), SIGKILL);
  });
  ASSERT_EQ(res.ranks[1].exit_code, -SIGKILL) << res.summary();
  res.ranks[1].exit_code = 0;
  ASSERT_TRUE(res.ok()) << res.summary();
  print_records(res, "error");
  for (int r : {0, 2}) {
    const std::string e = record_of(res, r, "error");
    EXPECT_TRUE(e.find("PeerError") == 0 || e.find("AbortedError") == 0) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("rank_1"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_LT(std::stoll(record_of(res, r, "error_ms")), 5000) << "rank " << r;
  }
}

}  // namespace
}  // namespace smddp::testing
