// The dozing engine (SMDDP_ENGINE_DOZE_US): for a while after a collective was queued, the idle
// engine thread sleeps with a timeout and a newly queued collective does not wake it, so that a
// caller who waits at once runs it itself with no futex wake (torch 2.6's all_reduce). What must
// hold: such a collective is not started behind the caller's back (no wake happened); one nobody
// waits for still starts, after a tick (not sooner: its caller may be about to wait), and after
// it queued work wakes the engine again;
// expedite(), CUDA collectives (start_now) and
// point-to-point ops wake it at once; after the window the thread sleeps until woken (no timed
// wake-ups: an idle communicator costs no CPU). Driven at the engine's level. Named Engine* so
// that the TSan step runs them.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "engine/engine.h"
#include "smddp/communicator.h"

namespace smddp::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A collective that records which thread ran it.
struct Recorded {
  std::shared_ptr<detail::OpState> state = std::make_shared<detail::OpState>();
  std::shared_ptr<std::atomic<std::thread::id>> ran_on = std::make_shared<std::atomic<std::thread::id>>();

  engine::Task task(uint64_t seq) const {
    state->seq = seq;
    state->name = "allreduce";
    state->rank = 0;
    engine::Task t;
    t.state = state;
    t.run = [r = ran_on] { r->store(std::this_thread::get_id()); };
    return t;
  }
  bool done() const { return state->done.load(); }
};

std::shared_ptr<engine::Engine> dozing_engine(std::chrono::microseconds tick, std::chrono::microseconds window) {
  return std::make_shared<engine::Engine>(/*allow_inline=*/false, engine::Doze{tick, window});
}

void wait_until_dozing(engine::Engine& e) {
  const auto deadline = Clock::now() + 5s;
  while (!e.dozing() && Clock::now() < deadline) std::this_thread::sleep_for(100us);
  ASSERT_TRUE(e.dozing()) << "the engine thread did not doze after a queued collective";
}

// A collective queued now is left to its caller: not started within 50 ms (the tick must be
// far longer), then run by wait() on this thread.
void expect_left_to_caller(engine::Engine& e, uint64_t& seq) {
  Recorded probe;
  ASSERT_FALSE(e.submit(probe.task(++seq)));
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(probe.done()) << "the dozing engine thread was woken for a collective its caller will wait for";
  Work(probe.state).wait();
  EXPECT_EQ(probe.ran_on->load(), std::this_thread::get_id()) << "wait() should have run the queued collective itself";
}

// Queues collectives and waits for them until one was run by this thread's wait() (the engine
// thread, woken for the first, may take it before wait() does), then waits for the engine to
// doze: the state in which a queued collective does not wake it. With `probe` (long ticks
// only), checks that it is that state.
void make_it_doze(engine::Engine& e, uint64_t& seq, bool probe = true) {
  bool ran_here = false;
  for (int attempt = 0; attempt < 200 && !ran_here; ++attempt) {
    Recorded r;
    ASSERT_FALSE(e.submit(r.task(++seq)));
    Work(r.state).wait();
    ran_here = r.ran_on->load() == std::this_thread::get_id();
  }
  ASSERT_TRUE(ran_here) << "the engine thread took every one of 200 collectives before wait() did";
  wait_until_dozing(e);
  if (probe) expect_left_to_caller(e, seq);
}

bool finishes_within(const Recorded& r, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!r.done() && Clock::now() < deadline) std::this_thread::sleep_for(100us);
  return r.done();
}

TEST(EngineDoze, AQueuedCollectiveDoesNotWakeItAndTheWaiterRunsIt) {
  auto e = dozing_engine(30s, 60s);  // a tick that never comes within the test
  uint64_t seq = 0;
  make_it_doze(*e, seq);  // its probe is the first check
  for (int i = 0; i < 3; ++i) expect_left_to_caller(*e, seq);  // and the state lasts
}

// wait() that cannot run its collective itself (another queued before it), wait_for() (which
// never runs it) and expedite() of a later collective start what is queued at once: a caller
// who waits must not sit out the tick.
TEST(EngineDoze, WaitersAndExpediteDoNotSitOutATick) {
  auto e = dozing_engine(30s, 60s);
  uint64_t seq = 0;
  make_it_doze(*e, seq);
  Recorded first, second;
  ASSERT_FALSE(e->submit(first.task(++seq)));
  ASSERT_FALSE(e->submit(second.task(++seq)));
  auto t0 = Clock::now();
  Work(second.state).wait();  // `first` is in front: run_here cannot serve it
  EXPECT_TRUE(first.done());
  EXPECT_LT(Clock::now() - t0, 10s) << "waiting on a collective queued second sat out the tick";

  make_it_doze(*e, seq);
  Recorded third, fourth;
  ASSERT_FALSE(e->submit(third.task(++seq)));
  ASSERT_FALSE(e->submit(fourth.task(++seq)));
  Work(fourth.state).expedite();
  EXPECT_TRUE(finishes_within(fourth, 10000ms)) << "expedite() of a collective queued second did not start it";
  EXPECT_TRUE(third.done());

  make_it_doze(*e, seq);
  Recorded timed;
  ASSERT_FALSE(e->submit(timed.task(++seq)));
  t0 = Clock::now();
  EXPECT_TRUE(Work(timed.state).wait_for(10000ms)) << "wait_for() of a queued collective sat out the tick";
  EXPECT_NE(timed.ran_on->load(), std::this_thread::get_id());
}

TEST(EngineDoze, ACollectiveNobodyWaitsForStartsAfterATickThenQueuedWorkWakesIt) {
  auto e = dozing_engine(2s, 60s);
  uint64_t seq = 0;
  make_it_doze(*e, seq);
  Recorded unwaited;
  const auto queued = Clock::now();
  ASSERT_FALSE(e->submit(unwaited.task(++seq)));
  ASSERT_TRUE(finishes_within(unwaited, 10000ms)) << "a queued collective nobody waited for never started";
  ASSERT_NE(unwaited.ran_on->load(), std::this_thread::get_id());
  // Left to its caller for a tick: taken sooner, it would make a caller about to wait() sleep.
  EXPECT_GE(Clock::now() - queued, 1500ms) << "the engine took a collective queued without a wake before a tick";
  // The caller is not waiting for its work: the next one must not sit out a tick.
  wait_until_dozing(*e);
  Recorded next;
  const auto t0 = Clock::now();
  ASSERT_FALSE(e->submit(next.task(++seq)));
  ASSERT_TRUE(finishes_within(next, 5000ms));
  EXPECT_NE(next.ran_on->load(), std::this_thread::get_id());
  // Woken, it starts within the scheduler's latency; unwoken, a tick (2 s) after it was queued.
  EXPECT_LT(Clock::now() - t0, 1s) << "queued work after an unwaited collective waited for the tick";
}

TEST(EngineDoze, ExpediteStartCudaCollectivesAndPointToPointWakeItAtOnce) {
  auto e = dozing_engine(30s, 60s);
  uint64_t seq = 0;
  make_it_doze(*e, seq);
  Recorded expedited;
  ASSERT_FALSE(e->submit(expedited.task(++seq)));
  Work(expedited.state).expedite();
  ASSERT_TRUE(finishes_within(expedited, 5000ms)) << "expedite() did not wake the dozing engine";
  EXPECT_NE(expedited.ran_on->load(), std::this_thread::get_id());

  make_it_doze(*e, seq);
  Recorded cuda;
  engine::Task t = cuda.task(++seq);
  t.start_now = true;
  ASSERT_FALSE(e->submit(std::move(t)));
  ASSERT_TRUE(finishes_within(cuda, 5000ms)) << "a start_now collective did not wake the dozing engine";

  make_it_doze(*e, seq);
  engine::Task recv;
  recv.state = std::make_shared<detail::OpState>();
  recv.state->seq = ++seq;
  recv.state->name = "recv";
  recv.p2p = true;
  recv.poll = [] { return true; };
  auto recv_state = recv.state;
  ASSERT_FALSE(e->submit(std::move(recv)));
  const auto deadline = Clock::now() + 5s;
  while (!recv_state->done.load() && Clock::now() < deadline) std::this_thread::sleep_for(100us);
  EXPECT_TRUE(recv_state->done.load()) << "a receive did not wake the dozing engine";
}

TEST(EngineDoze, AfterTheWindowItSleepsUntilWoken) {
  // A window long enough to be seen dozing in on a loaded, sanitized run; then its end is
  // waited for, not slept past.
  auto e = dozing_engine(1ms, 300ms);
  uint64_t seq = 0;
  make_it_doze(*e, seq, /*probe=*/false);
  const auto dozing_since = Clock::now();
  while (e->dozing() && Clock::now() < dozing_since + 5s) std::this_thread::sleep_for(1ms);
  const auto dozed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - dozing_since);
  ASSERT_FALSE(e->dozing()) << "the engine was still dozing 5 s after a 300 ms window";
  // The window, with slack for a loaded or sanitized run, not a window that ran on.
  EXPECT_LT(dozed, 2000ms) << "the 300 ms doze window lasted " << dozed.count() << " ms";
  const size_t ticks = e->doze_ticks();
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(e->doze_ticks(), ticks) << "the idle engine kept waking up after its doze window";
  EXPECT_FALSE(e->dozing());
  // And a collective queued then wakes it (nobody waits for it here).
  Recorded r;
  ASSERT_FALSE(e->submit(r.task(++seq)));
  EXPECT_TRUE(finishes_within(r, 5000ms)) << "a collective queued after the window did not wake the engine";
}

TEST(EngineDoze, ZeroTickWakesForEveryQueuedCollective) {
  auto e = dozing_engine(0us, 60s);
  Recorded first;
  ASSERT_FALSE(e->submit(first.task(1)));
  Work(first.state).wait();
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(e->dozing());
  Recorded r;
  ASSERT_FALSE(e->submit(r.task(2)));
  EXPECT_TRUE(finishes_within(r, 5000ms));
  EXPECT_EQ(e->doze_ticks(), 0u);
}

}  // namespace
}  // namespace smddp::testing
