// Which thread runs a collective when the engine thread is the default (inline_execution off, as
// the PyTorch backend sets it): an InlineScope runs an idle communicator's collective on the
// calling thread before the call returns (torch's synchronous calls); Work::wait() runs a
// collective nobody has started yet (Engine::run_here); without either, the call returns at
// once and the engine thread runs it. Named Engine* so that the TSan step runs them: run_here
// races the engine thread for the same queue entry on every call.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "collective/harness.h"
#include "engine/engine.h"

namespace smddp::testing {
namespace {

using namespace std::chrono_literals;

Options engine_thread_options() {
  Options o;
  o.inline_execution = false;
  return o;
}

// Rank 1 arrives 1100 ms late each round (a margin a loaded, sanitized run keeps); rank 0 looks at whether its call returned with the
// collective finished (it ran here) or at once (the engine thread has it). Rank 0 first lets its
// engine go idle: the engine thread completes an operation (wait() returns) a moment before it
// is free for the next, and a call made in that moment is queued behind it as it should be.
TEST(EngineCallerThread, InlineScopeRunsBeforeReturningAndAsyncReturnsAtOnce) {
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Communicator c(store, rank, w, engine_thread_options());
    std::vector<float> v(4096);
    // outer scope, inner scope (-1: none), and whether the call should run here
    struct Round {
      int outer, inner;
      bool here;
    };
    const Round rounds[] = {{-1, -1, false}, {1, -1, true}, {1, 0, false}, {0, 1, true}, {-1, -1, false}};
    for (const Round& r : rounds) {
      std::fill(v.begin(), v.end(), static_cast<float>(rank + 1));
      c.barrier().wait();
      std::this_thread::sleep_for(rank == 1 ? 1200ms : 100ms);
      const auto t0 = std::chrono::steady_clock::now();
      Work work;
      {
        std::optional<InlineScope> outer, inner;
        if (r.outer >= 0) outer.emplace(r.outer == 1);
        if (r.inner >= 0) inner.emplace(r.inner == 1);
        work = c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum);
      }
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      const bool done = work.test();
      work.wait();
      if (v.front() != 3.0f || v.back() != 3.0f) rep.fail("allreduce gave " + std::to_string(v.front()));
      if (rank != 0) continue;
      const std::string which = "scopes (" + std::to_string(r.outer) + ", " + std::to_string(r.inner) + "): ";
      if (r.here && !done) rep.fail(which + "the allreduce had not finished when the call returned");
      if (!r.here && (done || took > 500ms))
        rep.fail(which + "the call waited for the late peer (" + std::to_string(took.count()) + " ms)");
    }
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// Issue-and-wait (wait() races the engine thread for the collective) and several in flight
// waited for out of order: every result right, in issue order. What TSan checks here is the
// hand-over between run_here and the engine thread.
TEST(EngineCallerThread, WaitRunsQueuedCollectivesInIssueOrder) {
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Communicator c(store, rank, w, engine_thread_options());
    std::vector<float> v(4096);
    for (int i = 0; i < 300; ++i) {
      const size_t n = 1 + static_cast<size_t>(i * 37) % v.size();
      std::fill(v.begin(), v.begin() + n, static_cast<float>(rank + i));
      c.allreduce(v.data(), v.data(), n, DataType::f32, ReduceOp::sum).wait();
      const float want = static_cast<float>(2 * i + 1);
      if (v[0] != want || v[n - 1] != want) rep.fail("allreduce " + std::to_string(i) + " gave " + std::to_string(v[0]));
    }
    // In flight together and waited for last to first: sum, prod, sum of 1 + rank gives 18 only
    // in issue order (prod first: 8; the sums first: 36).
    for (int i = 0; i < 30; ++i) {
      int64_t x = rank + 1;
      std::vector<Work> works;
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::sum})
        works.push_back(c.allreduce(&x, &x, 1, DataType::i64, op));
      for (int k = 2; k >= 0; --k) works[k].wait();
      if (x != 18) rep.fail("sum, prod, sum in flight gave " + std::to_string(x) + ", expected 18");
    }
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// A collective issued while a receive is in flight does not wait for it (its peer may send only
// after that collective, as gloo and NCCL allow: P2P.ACollectiveRunsBesideASendOrReceiveInFlight),
// and runs on the engine thread, which polls the receive from inside the collective's waits,
// also when the caller asks for it to run here: on the caller's thread it would use the node's
// segment at the same time as the engine thread's polls. Rank 0 receives (rank 1 sends 200 ms
// late), then at once allreduces another buffer; the allreduce's callback runs on the thread
// that ran it. The engine thread polls the receive without its lock, so "no p2p op running"
// must not be read from its list of them.
TEST(EngineCallerThread, ACollectiveBesideAReceiveInFlightRunsOnTheEngineThread) {
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Communicator c(store, rank, w, engine_thread_options());
    for (int round = 0; round < 3; ++round) {
      std::vector<float> v(1024, rank == 0 ? 2.0f : 1.0f), got(1024, 0.0f);
      c.barrier().wait();
      Work received;
      if (rank == 0) {
        received = c.recv(got.data(), got.size(), DataType::f32, 1, 7);
      } else {
        std::this_thread::sleep_for(200ms);
        std::vector<float> five(v.size(), 5.0f);
        c.send(five.data(), five.size(), DataType::f32, 0, 7).wait();
      }
      Work sum;
      std::atomic<bool> ran_here{false};
      {
        InlineScope scope(round != 1);  // round 1: the engine thread's way
        sum = c.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum);
        const std::thread::id caller = std::this_thread::get_id();
        sum.then([&ran_here, caller](std::exception_ptr) { ran_here = std::this_thread::get_id() == caller; });
      }
      sum.wait();
      if (rank == 0 && ran_here)
        rep.fail("round " + std::to_string(round) + ": the allreduce ran on its caller's thread beside a receive in flight");
      if (v.front() != 3.0f || v.back() != 3.0f)
        rep.fail("round " + std::to_string(round) + ": allreduce beside a receive in flight gave " +
                 std::to_string(v.front()) + ", expected 3");
      if (rank == 0) {
        received.wait();
        if (got.front() != 5.0f || got.back() != 5.0f)
          rep.fail("round " + std::to_string(round) + ": the receive got " + std::to_string(got.front()));
      }
    }
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// A completion callback that issues collectives and waits for one (DDP's PowerSGD hook does this
// from a future's then()): the thread running the callback holds the engine, so the nested
// collectives run on it, in issue order (`x`, issued first and not waited for, runs before
// `second`). Depth 2: `second`'s callback nests again. With the engine thread and inline. (If
// `first` is already done when then() is called, the callback runs on this thread instead, and
// the engine thread runs the nested ones: the same results.)
TEST(EngineCallerThread, ACallbackCanWaitOnACollectiveItIssues) {
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    for (bool inline_on : {false, true}) {
      Options o;
      o.inline_execution = inline_on;
      Communicator c(store, rank, w, o);
      for (int round = 0; round < 5; ++round) {
        int64_t a = rank + 1, b = 10 * (rank + 1), d = 100 * (rank + 1), x = rank + 1;
        std::atomic<bool> inner_done{false};
        Work xw;
        Work first = c.allreduce(&a, &a, 1, DataType::i64, ReduceOp::sum);
        first.then([&](std::exception_ptr e) {
          if (e) return;
          xw = c.allreduce(&x, &x, 1, DataType::i64, ReduceOp::prod);
          Work second = c.allreduce(&b, &b, 1, DataType::i64, ReduceOp::sum);
          second.then([&](std::exception_ptr e2) {
            if (e2) return;
            c.allreduce(&d, &d, 1, DataType::i64, ReduceOp::sum).wait();
            inner_done = true;
          });
          second.wait();
        });
        first.wait();  // returns after first's callbacks: the whole chain
        xw.wait();
        const std::string mode = inline_on ? "inline" : "engine thread";
        if (a != 3 || b != 30 || d != 300 || x != 2 || !inner_done)
          rep.fail(mode + ": nested collectives gave a=" + std::to_string(a) + " b=" + std::to_string(b) +
                   " d=" + std::to_string(d) + " x=" + std::to_string(x));
      }
    }
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// The same beside a receive in flight (a collective issued while a receive waits runs beside it
// on the engine thread: ACollectiveBesideAReceiveInFlightRunsOnTheEngineThread): its callback's
// nested collectives run there too, polling the receive from their waits; its wait used to throw
// "point-to-point work ... would never end" once collectives no longer waited for receives
// (found by review). Rank 1 sends only after the whole chain, so the receive is in flight
// throughout.
TEST(EngineCallerThread, ACallbackCanWaitOnACollectiveItIssuesBesideAReceiveInFlight) {
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.timeout = std::chrono::seconds(20);
    Communicator c(store, rank, w, o);
    for (int round = 0; round < 3; ++round) {
      int64_t a = rank + 1, b = 10 * (rank + 1), got = -1;
      Work received;
      if (rank == 0) received = c.recv(&got, 1, DataType::i64, 1, 4);
      Work first = c.allreduce(&a, &a, 1, DataType::i64, ReduceOp::sum);
      std::string inner_error;
      first.then([&](std::exception_ptr e) {
        if (e) return;
        try {
          c.allreduce(&b, &b, 1, DataType::i64, ReduceOp::sum).wait();
        } catch (const Error& x) {
          inner_error = x.what();
        }
      });
      try {
        first.wait();
      } catch (const Error& e) {
        rep.fail("round " + std::to_string(round) + ": " + e.what());
        return;
      }
      if (!inner_error.empty()) rep.fail("round " + std::to_string(round) + ": the nested wait: " + inner_error);
      if (a != 3 || b != 30) rep.fail("nested collectives gave a=" + std::to_string(a) + " b=" + std::to_string(b));
      if (rank == 1) {
        const int64_t v = 40 + round;
        c.send(&v, 1, DataType::i64, 0, 4).wait();
      } else {
        received.wait();
        if (got != 40 + round) rep.fail("the receive got " + std::to_string(got));
      }
    }
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// The same at the engine's level, deterministically: a collective claimed inline, whose callback
// (on this thread, the holder) issues one collective and waits, through Work::wait, for it and
// for one queued before the callback ran. Both run here, in issue order; nothing else does.
TEST(EngineCallerThread, TheHolderRunsNestedWorkHereInOrder) {
  auto engine = std::make_shared<engine::Engine>(/*allow_inline=*/true);
  std::vector<int> ran;
  std::vector<std::thread::id> where;
  uint64_t next_seq = 0;
  auto task = [&](int id) {
    engine::Task t;
    t.state = std::make_shared<detail::OpState>();
    t.state->seq = ++next_seq;
    t.run = [&, id] {
      ran.push_back(id);
      where.push_back(std::this_thread::get_id());
    };
    return t;
  };
  engine::Task first = task(1);
  engine::Task earlier = task(2);
  auto earlier_state = earlier.state;
  std::shared_ptr<detail::OpState> nested_state;
  first.state->on_complete([&](std::exception_ptr) {
    (void)engine->submit(std::move(earlier));  // queued: this thread holds the engine
    engine::Task nested = task(3);
    nested_state = nested.state;
    if (engine->submit(std::move(nested))) ADD_FAILURE() << "a nested collective was claimed inline";
    Work(nested_state).wait();  // runs 2, then 3, here
    Work(earlier_state).wait();
  });
  auto claimed = engine->submit(std::move(first));
  ASSERT_TRUE(claimed.has_value()) << "an idle engine with inline execution did not hand the task back";
  engine->run_claimed(std::move(*claimed));
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  for (auto& id : where) EXPECT_EQ(id, std::this_thread::get_id());
  EXPECT_EQ(engine->pending(), 0u);
}

// A shutdown that comes while the engine thread itself sits in a callback waiting on nested work
// (the communicator destroyed meanwhile): the engine thread cannot fail its queue then, so the
// waiter fails the nested work itself instead of waiting forever.
TEST(EngineCallerThread, ShutdownFailsNestedWorkTheEngineThreadWaitsOn) {
  auto engine = std::make_shared<engine::Engine>(/*allow_inline=*/false);
  std::atomic<bool> in_callback{false}, failed{false};
  engine::Task first;
  first.state = std::make_shared<detail::OpState>();
  first.state->seq = 1;
  first.run = [] {};
  first.state->on_complete([&](std::exception_ptr) {
    engine::Task nested;
    nested.state = std::make_shared<detail::OpState>();
    nested.state->seq = 2;
    nested.run = [] {};
    auto nested_state = nested.state;
    (void)engine->submit(std::move(nested));  // queued: this thread holds the engine
    in_callback = true;
    // Until the shutdown has begun: a task submitted after it fails at once.
    for (uint64_t seq = 3; seq < 100000; ++seq) {
      engine::Task probe;
      probe.state = std::make_shared<detail::OpState>();
      probe.state->seq = seq;
      probe.run = [] {};
      auto probe_state = probe.state;
      (void)engine->submit(std::move(probe));
      if (probe_state->done) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    try {
      Work(nested_state).wait();
    } catch (const Error&) {
      failed = true;
    }
  });
  (void)engine->submit(std::move(first));
  while (!in_callback) std::this_thread::yield();
  engine->shutdown(nullptr);  // sets stop_, then joins the engine thread, which is in the callback
  EXPECT_TRUE(failed) << "the nested work was not failed by the shutdown";
}

}  // namespace
}  // namespace smddp::testing
