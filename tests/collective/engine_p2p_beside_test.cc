// Sends and receives issued while a collective runs (on the engine thread or a caller's), or
// queued behind one: they start from that collective's waits (Engine::poll_p2p_beside), as gloo
// and NCCL start them at once. They used to wait for the collective, whose peer may join it only
// after this very send (an async_op allreduce, then a send to a rank that receives before its
// allreduce): both ranks hung until the timeout. Driven at the engine's level, so that what runs where is certain
// rather than timed; tests/collective/p2p_beside_collective_test.cc runs it over the transports.
// Named Engine* so that the TSan step runs them.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collective/engine_tasks.h"
#include "engine/engine.h"

namespace smddp::testing {
namespace {

using Clock = std::chrono::steady_clock;

// A send whose first poll records its name in `started` (in poll order) and which finishes at
// once: what a small send into a FIFO with room does.
engine::Task send_task(uint64_t seq, std::string name, std::shared_ptr<std::vector<std::string>> started,
                       std::shared_ptr<std::mutex> mu) {
  engine::Task t;
  t.state = new_state(seq, "send");
  t.p2p = true;
  t.poll = [name = std::move(name), started, mu] {
    std::lock_guard<std::mutex> g(*mu);
    started->push_back(name);
    return true;
  };
  return t;
}

// A collective that waits, as a real one's waits do, polling the ops beside it, until `until`
// holds or 5 s pass (then it gives up: what the peer's missing share would make it do).
engine::Task polling_collective(uint64_t seq, engine::Engine& e, std::function<bool()> until,
                                std::atomic<bool>* running, std::atomic<bool>* gave_up) {
  return collective(seq, [&e, until = std::move(until), running, gave_up] {
    if (running) running->store(true);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!until()) {
      if (Clock::now() > deadline) {
        gave_up->store(true);
        return;
      }
      e.poll_p2p_beside();
      std::this_thread::yield();
    }
  });
}

TEST(EngineP2pBeside, ASendSubmittedWhileACollectiveRunsStartsFromItsWaits) {
  std::atomic<int> wakes{0};
  auto engine = std::make_shared<engine::Engine>(false, engine::Doze{}, engine::P2pSleep{}, engine::P2pSleep{},
                                                 [&wakes] { wakes.fetch_add(1); });
  auto started = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  std::atomic<bool> running{false}, gave_up{false};
  auto sent = [&] {
    std::lock_guard<std::mutex> g(*mu);
    return !started->empty();
  };
  engine::Task c = polling_collective(1, *engine, sent, &running, &gave_up);
  auto c_state = c.state;
  (void)engine->submit(std::move(c));
  while (!running) std::this_thread::yield();
  engine::Task s = send_task(2, "send", started, mu);
  auto s_state = s.state;
  (void)engine->submit(std::move(s));
  EXPECT_EQ(wait_error(c_state), "");
  EXPECT_FALSE(gave_up) << "the send submitted while the collective ran did not start before it ended";
  EXPECT_EQ(wait_error(s_state), "");
  EXPECT_GE(wakes.load(), 1) << "the collective's waits were not woken for the send";
  EXPECT_EQ(engine->pending(), 0u);
}

// Also past a collective queued behind the running one (a second async_op allreduce), and in
// issue order among themselves; the queued collective runs after the first, as before.
TEST(EngineP2pBeside, SendsQueuedBehindALaterCollectiveStartInIssueOrder) {
  auto engine = std::make_shared<engine::Engine>(false);
  auto started = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  std::atomic<bool> running{false}, gave_up{false}, second_ran{false};
  auto both_sent = [&] {
    std::lock_guard<std::mutex> g(*mu);
    return started->size() == 2;
  };
  engine::Task first = polling_collective(1, *engine, both_sent, &running, &gave_up);
  auto first_state = first.state;
  (void)engine->submit(std::move(first));
  while (!running) std::this_thread::yield();
  engine::Task second = collective(2, [&] { second_ran = true; });
  auto second_state = second.state;
  (void)engine->submit(std::move(second));
  (void)engine->submit(send_task(3, "a", started, mu));
  (void)engine->submit(send_task(4, "b", started, mu));
  EXPECT_EQ(wait_error(first_state), "");
  EXPECT_FALSE(gave_up) << "the sends behind a queued collective waited for both collectives";
  EXPECT_EQ(wait_error(second_state), "");
  EXPECT_TRUE(second_ran);
  std::lock_guard<std::mutex> g(*mu);
  EXPECT_EQ(*started, (std::vector<std::string>{"a", "b"}));
}

// Queued while the engine thread was busy with an earlier collective that never waited (so
// never took them), ahead of the next one: that next one's waits start them.
TEST(EngineP2pBeside, SendsQueuedBeforeTheCollectiveStartedStartFromItsWaits) {
  auto engine = std::make_shared<engine::Engine>(false);
  auto started = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  std::atomic<bool> first_running{false}, release{false}, gave_up{false};
  engine::Task first = collective(1, [&] {
    first_running = true;
    while (!release) std::this_thread::yield();
  });
  (void)engine->submit(std::move(first));
  while (!first_running) std::this_thread::yield();
  auto sent = [&] {
    std::lock_guard<std::mutex> g(*mu);
    return !started->empty();
  };
  engine::Task second = polling_collective(2, *engine, sent, nullptr, &gave_up);
  auto second_state = second.state;
  (void)engine->submit(std::move(second));
  (void)engine->submit(send_task(3, "send", started, mu));
  release = true;
  EXPECT_EQ(wait_error(second_state), "");
  EXPECT_FALSE(gave_up) << "a send queued behind a collective waited for it";
  EXPECT_EQ(engine->pending(), 0u);
}

// A collective with sends or receives queued behind it starts them from its waits whichever
// thread runs it: a caller's wait that finds it still queued (run_here), or the engine thread.
// (Until session 46 run_here left such a collective to the engine thread, then the only one
// whose waits started them.) Which comes first is left to chance here; the send starts either way.
TEST(EngineP2pBeside, ACollectiveWithSendsQueuedBehindItStartsThemOnEitherThread) {
  for (int round = 0; round < 20; ++round) {
    auto engine = std::make_shared<engine::Engine>(false);
    auto started = std::make_shared<std::vector<std::string>>();
    auto mu = std::make_shared<std::mutex>();
    std::atomic<bool> gave_up{false};
    auto sent = [&] {
      std::lock_guard<std::mutex> g(*mu);
      return !started->empty();
    };
    engine::Task c = polling_collective(1, *engine, sent, nullptr, &gave_up);
    auto c_state = c.state;
    (void)engine->submit(std::move(c));
    (void)engine->submit(send_task(2, "send", started, mu));
    EXPECT_EQ(wait_error(c_state), "");  // Work::wait: run_here, else expedite and wait
    ASSERT_FALSE(gave_up) << "round " << round << ": the send queued behind the collective did not start";
  }
}

// A collective that runs on its caller's thread (inline execution, or run_here: torch's
// synchronous calls) while another thread of the process sends on the same communicator: the
// send starts from the collective's waits, as on the engine thread. It used to sit in the queue
// until the collective ended, and the collective waited for a peer that joins it only after that
// send: both ranks hung until the timeout.
TEST(EngineP2pBeside, ASendFromAnotherThreadStartsFromTheWaitsOfACollectiveOnItsCallersThread) {
  std::atomic<int> wakes{0};
  auto engine = std::make_shared<engine::Engine>(true, engine::Doze{}, engine::P2pSleep{}, engine::P2pSleep{},
                                                 [&wakes] { wakes.fetch_add(1); });
  auto started = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  std::atomic<bool> running{false}, gave_up{false};
  std::thread::id ran_on, sent_on;
  auto sent = [&] {
    std::lock_guard<std::mutex> g(*mu);
    return !started->empty();
  };
  engine::Task c = polling_collective(1, *engine, sent, &running, &gave_up);
  auto c_state = c.state;
  std::optional<engine::Task> claimed = engine->submit(std::move(c));
  ASSERT_TRUE(claimed) << "an idle engine with inline execution did not hand the collective back";
  std::thread other([&] {
    while (!running) std::this_thread::yield();
    engine::Task s = send_task(2, "send", started, mu);
    auto poll = std::move(s.poll);
    s.poll = [&sent_on, poll = std::move(poll)] {
      sent_on = std::this_thread::get_id();
      return poll();
    };
    auto s_state = s.state;
    (void)engine->submit(std::move(s));
    EXPECT_EQ(wait_error(s_state), "");
  });
  ran_on = std::this_thread::get_id();
  engine->run_claimed(std::move(*claimed));
  other.join();
  EXPECT_EQ(wait_error(c_state), "");
  EXPECT_FALSE(gave_up) << "the send from another thread waited for the collective on its caller's thread";
  EXPECT_EQ(sent_on, ran_on) << "the send did not start from the collective's waits";
  EXPECT_GE(wakes.load(), 1) << "the collective's waits were not woken for the send";
  EXPECT_EQ(engine->pending(), 0u);
}

// One that the caller's collective leaves unfinished goes on from the engine thread; one that a
// shutdown finds there fails with the shutdown's reason (the engine thread is gone by then).
TEST(EngineP2pBeside, WhatACollectiveOnItsCallersThreadLeavesInFlightGoesOnOrFails) {
  for (const bool stop : {false, true}) {
    auto engine = std::make_shared<engine::Engine>(true);
    auto arrived = std::make_shared<std::atomic<bool>>(false);
    std::atomic<bool> running{false}, polled{false}, release{false};
    std::shared_ptr<detail::OpState> r_state;
    engine::Task c = collective(1, [&] {
      running = true;
      while (!release) {
        if (engine->p2p_beside_pending()) {
          engine->poll_p2p_beside();
          polled = true;
        }
        std::this_thread::yield();
      }
    });
    auto c_state = c.state;
    std::optional<engine::Task> claimed = engine->submit(std::move(c));
    ASSERT_TRUE(claimed);
    std::thread caller([&] { engine->run_claimed(std::move(*claimed)); });
    while (!running) std::this_thread::yield();
    engine::Task r = receive(2, arrived);
    r_state = r.state;
    (void)engine->submit(std::move(r));
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!polled && Clock::now() < deadline) std::this_thread::yield();
    EXPECT_TRUE(polled) << "stop " << stop << ": the receive did not start from the collective's waits";
    std::thread stopper;
    if (stop) {
      // The shutdown waits for the caller's collective to return. A collective submitted after
      // it began fails at once; one queued before, when the engine thread stops: either way its
      // end says the shutdown has begun.
      stopper = std::thread([&] { engine->shutdown(std::make_exception_ptr(AbortedError("smddp: test stop"))); });
      engine::Task probe = collective(3);
      auto probe_state = probe.state;
      EXPECT_FALSE(engine->submit(std::move(probe)));
      EXPECT_NE(wait_error(probe_state).find("test stop"), std::string::npos);
    }
    release = true;
    caller.join();
    if (stop) {
      stopper.join();
      EXPECT_NE(wait_error(r_state).find("test stop"), std::string::npos) << "stop: " << wait_error(r_state);
    } else {
      EXPECT_FALSE(r_state->done.load()) << "the receive finished before it arrived";
      arrived->store(true);
      EXPECT_EQ(wait_error(r_state), "") << "the engine thread did not take the receive over";
    }
    EXPECT_EQ(wait_error(c_state), "");
    EXPECT_EQ(engine->pending(), 0u) << "stop " << stop;
  }
}

}  // namespace
}  // namespace smddp::testing
