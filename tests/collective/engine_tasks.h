// Engine tasks for the tests that drive the engine directly (no transport): collectives that
// run a function, receives that finish once a flag is set, and waiting for their end.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "engine/engine.h"
#include "smddp/communicator.h"
#include "smddp/errors.h"

namespace smddp::testing {

inline std::shared_ptr<detail::OpState> new_state(uint64_t seq, const char* name) {
  auto s = std::make_shared<detail::OpState>();
  s->seq = seq;
  s->name = name;
  s->rank = 0;
  return s;
}

inline engine::Task collective(uint64_t seq, std::function<void()> run = [] {}) {
  engine::Task t;
  t.state = new_state(seq, "allreduce");
  t.run = std::move(run);
  return t;
}

// A receive that finishes once `arrived` is set.
inline engine::Task receive(uint64_t seq, std::shared_ptr<std::atomic<bool>> arrived) {
  engine::Task t;
  t.state = new_state(seq, "recv");
  t.p2p = true;
  t.poll = [arrived] { return arrived->load(); };
  return t;
}

// Runs `t` the way an engine with or without inline execution would: claimed and run here, or
// by the engine thread, waited for here until it ended (callbacks included) without taking it:
// a Work::wait would run a collective still queued on this thread (run_here), so which thread
// ran it would be a race, and what a callback may wait on differs between the two.
inline void submit_and_run(engine::Engine& e, engine::Task t) {
  auto state = t.state;
  if (auto claimed = e.submit(std::move(t))) {
    e.run_claimed(std::move(*claimed));
    return;
  }
  std::unique_lock<std::mutex> lk(state->mu);
  state->cv.wait(lk, [&] { return state->done.load(std::memory_order_acquire); });
}

// Waits for `s`, returning the Error's message ("" if it succeeded).
inline std::string wait_error(const std::shared_ptr<detail::OpState>& s) {
  try {
    Work(s).wait();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace smddp::testing
