// Completion callbacks (Work::then) that go wrong: one that throws, and one that waits on work
// only the engine can progress once the callback returns. Both used to hang their waiters (or
// end the process: an exception escaping the engine thread is std::terminate); each must now end
// in an Error naming the operation, with the engine still serving later work. Driven at the
// engine's level, so that which thread holds the engine is certain rather than timed. Named
// Engine* so that the TSan step runs them.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "collective/engine_tasks.h"
#include "engine/engine.h"
#include "smddp/communicator.h"
#include "smddp/errors.h"

namespace smddp::testing {
namespace {

TEST(EngineCallbacks, OneThatThrowsFailsTheWaitersAndTheRestStillRun) {
  for (bool inline_on : {false, true}) {
    SCOPED_TRACE(inline_on ? "inline" : "engine thread");
    auto engine = std::make_shared<engine::Engine>(inline_on);
    engine::Task first = collective(1);
    auto first_state = first.state;
    std::atomic<bool> second_ran{false};
    first_state->on_complete([](std::exception_ptr) { throw std::runtime_error("hook failed: boom"); });
    first_state->on_complete([&](std::exception_ptr e) { second_ran = !e; });
    submit_and_run(*engine, std::move(first));
    const std::string err = wait_error(first_state);
    EXPECT_NE(err.find("allreduce #1 on rank 0"), std::string::npos) << err;
    EXPECT_NE(err.find("hook failed: boom"), std::string::npos) << err;
    EXPECT_TRUE(second_ran) << "a callback after the one that threw did not run (or saw an error)";
    // The engine goes on.
    engine::Task next = collective(2);
    auto next_state = next.state;
    submit_and_run(*engine, std::move(next));
    EXPECT_EQ(wait_error(next_state), "");
    EXPECT_EQ(engine->pending(), 0u);
  }
}

// A callback that adds another callback to its own operation (Work::then inside Work::then): the
// new one runs too, after the ones already there and before waiters wake. It used to wait for
// the operation's end on the very thread that ends it, after the callback returns: the engine
// thread (or the inline caller) hung.
TEST(EngineCallbacks, ACallbackThatAddsOneToItsOwnOperationRunsIt) {
  for (bool inline_on : {false, true}) {
    SCOPED_TRACE(inline_on ? "inline" : "engine thread");
    auto engine = std::make_shared<engine::Engine>(inline_on);
    engine::Task first = collective(1);
    auto state = first.state;
    std::atomic<int> order{0}, outer_at{-1}, inner_at{-1};
    state->on_complete([&, state](std::exception_ptr) {
      outer_at = order++;
      state->on_complete([&](std::exception_ptr e) { inner_at = e ? -2 : order++; });
    });
    submit_and_run(*engine, std::move(first));
    EXPECT_EQ(wait_error(state), "");
    EXPECT_EQ(outer_at, 0);
    EXPECT_EQ(inner_at, 1) << "the callback added by a callback did not run before the wait ended";
    // The engine goes on.
    engine::Task next = collective(2);
    auto next_state = next.state;
    submit_and_run(*engine, std::move(next));
    EXPECT_EQ(wait_error(next_state), "");
  }
}

// What the operation failed with stays its error: a callback that then throws too does not
// replace it.
TEST(EngineCallbacks, AnOperationsOwnErrorWinsOverACallbacks) {
  auto engine = std::make_shared<engine::Engine>(false);
  engine::Task first = collective(1, [] { throw PeerError("smddp: peer 1 left", 1); });
  auto first_state = first.state;
  first_state->on_complete([](std::exception_ptr) { throw std::runtime_error("boom"); });
  submit_and_run(*engine, std::move(first));
  EXPECT_THROW(Work(first_state).wait(), PeerError);
}

// A collective's callback that waits on a receive (which only polling after the callback
// returns can finish), or on a collective queued behind that receive. The one exception: the
// callback runs inside the collective's run, beside which a receive submitted meanwhile starts
// (poll_p2p_beside), so a collective queued behind it runs nested there, its waits polling the
// receive; it needs nothing from the receive here, so it ends while the receive stays in
// flight. So on either thread: on a caller's (inline) too since session 46, where the receive
// was the engine thread's to poll and the wait an error.
TEST(EngineCallbacks, WaitingInsideACallbackOnWorkThatCannotProgressIsAnError) {
  for (bool on_collective_behind : {false, true}) {
    for (bool inline_on : {false, true}) {
      SCOPED_TRACE(std::string(inline_on ? "inline" : "engine thread") +
                   (on_collective_behind ? ", collective behind a receive" : ", a receive"));
      auto engine = std::make_shared<engine::Engine>(inline_on);
      auto arrived = std::make_shared<std::atomic<bool>>(false);
      std::shared_ptr<detail::OpState> recv_state, behind_state;
      std::string err;
      bool recv_done_at_wait_end = false;
      engine::Task first = collective(1);
      auto first_state = first.state;
      first_state->on_complete([&](std::exception_ptr) {
        engine::Task r = receive(2, arrived);
        recv_state = r.state;
        (void)engine->submit(std::move(r));
        if (on_collective_behind) {
          engine::Task c = collective(3);
          behind_state = c.state;
          (void)engine->submit(std::move(c));
          err = wait_error(behind_state);
        } else {
          err = wait_error(recv_state);
        }
        recv_done_at_wait_end = recv_state->done.load();
      });
      submit_and_run(*engine, std::move(first));
      EXPECT_EQ(wait_error(first_state), "");
      EXPECT_FALSE(recv_done_at_wait_end) << "the receive ended before its message arrived";
      if (on_collective_behind) {
        EXPECT_EQ(err, "") << "the collective behind the receive did not run beside it, nested";
      } else {
        const std::string which = on_collective_behind ? "allreduce #3" : "recv #2";
        EXPECT_NE(err.find(which + " on rank 0 was waited for inside a completion callback"), std::string::npos)
            << "got: '" << err << "'";
      }
      // Nothing is lost: once the callback has returned, the receive and what follows finish.
      arrived->store(true);
      EXPECT_EQ(wait_error(recv_state), "");
      if (behind_state) {
        EXPECT_EQ(wait_error(behind_state), "");
      }
      EXPECT_EQ(engine->pending(), 0u);
    }
  }
}

// A receive's callback that waits on a collective issued after the receive, which is running on
// this very thread: a collective runs beside the receives in flight and polls them from its
// waits (poll_p2p_beside, which the collective below calls as a real one's waits would), so the
// receive completes, and its callback runs, inside the collective. The message arrives only
// once both are queued, so the collective cannot end first.
TEST(EngineCallbacks, AReceivesCallbackWaitingOnALaterCollectiveIsAnError) {
  auto engine = std::make_shared<engine::Engine>(false);
  auto arrived = std::make_shared<std::atomic<bool>>(false);
  engine::Task r = receive(1, arrived);
  auto recv_state = r.state;
  std::string err;
  std::atomic<bool> callback_done{false};
  engine::Task later = collective(2, [&] {
    while (!callback_done) {
      engine->poll_p2p_beside();
      std::this_thread::yield();
    }
  });
  auto later_state = later.state;
  recv_state->on_complete([&](std::exception_ptr) {
    err = wait_error(later_state);
    callback_done = true;
  });
  (void)engine->submit(std::move(r));
  (void)engine->submit(std::move(later));
  arrived->store(true);
  EXPECT_EQ(wait_error(later_state), "");
  EXPECT_TRUE(callback_done);
  EXPECT_NE(err.find("allreduce #2 on rank 0 was waited for inside a completion callback"), std::string::npos)
      << "got: '" << err << "'";
}

// A shutdown fails what never ran, in issue order: a receive's callback that waits on the
// collective queued behind it gets that collective's shutdown error, not a wait on the engine
// thread that is running the callback (shutdown would then never return). Both stay queued
// behind a first collective that returns only once the shutdown has begun (a collective no
// longer waits for a receive in flight, so behind the receive alone the second would run).
TEST(EngineCallbacks, OnShutdownAFailedReceivesCallbackWaitingOnALaterCollectiveEnds) {
  auto engine = std::make_shared<engine::Engine>(false);
  auto never = std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool> first_running{false}, shutting_down{false};
  engine::Task first = collective(1, [&] {
    first_running = true;
    while (!shutting_down) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // shutdown() has set its stop
  });
  engine::Task r = receive(2, never);
  engine::Task later = collective(3);
  auto later_state = later.state;
  std::string err;
  r.state->on_complete([&](std::exception_ptr) { err = wait_error(later_state); });
  (void)engine->submit(std::move(first));
  while (!first_running) std::this_thread::yield();
  (void)engine->submit(std::move(r));
  (void)engine->submit(std::move(later));
  shutting_down = true;
  engine->shutdown(nullptr);
  EXPECT_NE(err.find("destroyed"), std::string::npos) << "got: '" << err << "'";
  EXPECT_EQ(engine->pending(), 0u);
}

// A receive in flight when its engine stops lets go of its poll (whose owner withdraws the
// network transfer it posted: p2p_across_nodes.h) before its waiters and callbacks hear of the
// failure, since they may free the buffer at once. The poll used to go only after every op was
// failed and the queue drained.
TEST(EngineCallbacks, OnShutdownAReceiveInFlightLetsGoOfItsPollBeforeItsCallbackRuns) {
  auto engine = std::make_shared<engine::Engine>(false);
  struct Owner {  // stands in for a transfer machine: its destruction is the withdrawal
    explicit Owner(std::atomic<bool>* r) : released(r) {}
    std::atomic<bool>* released;
    ~Owner() { released->store(true); }
  };
  std::atomic<bool> polled{false}, released{false}, released_at_callback{false};
  engine::Task r;
  r.state = new_state(1, "recv");
  r.p2p = true;
  auto owner = std::make_shared<Owner>(&released);
  r.poll = [owner, &polled] {
    polled = true;
    return false;  // its message never comes
  };
  owner.reset();  // the poll holds the only reference
  auto state = r.state;
  state->on_complete([&](std::exception_ptr) { released_at_callback = released.load(); });
  (void)engine->submit(std::move(r));
  while (!polled) std::this_thread::yield();
  engine->shutdown(nullptr);
  EXPECT_NE(wait_error(state).find("destroyed"), std::string::npos);
  EXPECT_TRUE(released_at_callback) << "the callback ran while the receive's poll still held its transfer";
  EXPECT_TRUE(released);
}

// A callback of engine A's collective runs B's collective on this thread (inline), whose
// callback waits on A's work: this thread holds both, so A's nested work runs here too.
TEST(EngineCallbacks, NestingAcrossTwoEnginesOnOneThreadRunsHere) {
  auto a = std::make_shared<engine::Engine>(true);
  auto b = std::make_shared<engine::Engine>(true);
  std::vector<std::string> ran;
  engine::Task a1 = collective(1, [&] { ran.push_back("a1"); });
  auto a1_state = a1.state;
  a1_state->on_complete([&](std::exception_ptr) {
    engine::Task b1 = collective(1, [&] { ran.push_back("b1"); });
    b1.state->on_complete([&](std::exception_ptr) {
      engine::Task a2 = collective(2, [&] { ran.push_back("a2"); });
      auto a2_state = a2.state;
      if (a->submit(std::move(a2))) ADD_FAILURE() << "a held engine handed nested work back";
      EXPECT_EQ(wait_error(a2_state), "");
    });
    submit_and_run(*b, std::move(b1));
  });
  submit_and_run(*a, std::move(a1));
  EXPECT_EQ(wait_error(a1_state), "");
  EXPECT_EQ(ran, (std::vector<std::string>{"a1", "b1", "a2"}));
}

}  // namespace
}  // namespace smddp::testing
