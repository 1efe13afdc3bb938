#include "engine/engine.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#include "core/logging.h"
#include "smddp/errors.h"

namespace smddp::detail {

std::string OpState::describe() const {
  return std::string(name) + " #" + std::to_string(seq) + " on rank " + std::to_string(rank);
}

namespace {
std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}
}  // namespace

void OpState::complete(std::exception_ptr e) {
  std::vector<std::function<void(std::exception_ptr)>> cbs;
  {
    std::lock_guard<std::mutex> g(mu);
    error = std::move(e);
    completing = true;  // from here on, new callbacks wait for `done` and run on their own
    completer = std::this_thread::get_id();  // but not those the callbacks add (on_complete)
    cbs = std::move(callbacks);
    callbacks.clear();
  }
  // Callbacks run before waiters wake: a waiter may rely on what they did (copies, futures).
  // One that throws must not skip `done` (its waiters would wait forever) nor escape into the
  // engine thread (std::terminate): the waiters get the error instead.
  std::exception_ptr callback_error;
  while (!cbs.empty()) {
    for (auto& cb : cbs) {
      try {
        cb(error);
      } catch (...) {
        if (!callback_error) callback_error = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> g(mu);  // those the callbacks added
    cbs = std::move(callbacks);
    callbacks.clear();
  }
  if (callback_error) {
    const std::string msg = "smddp: " + describe() + ": a completion callback (Work::then) threw: " +
                            what_of(callback_error);
    SMDDP_LOG(WARN, rank) << msg;
    if (!error) error = std::make_exception_ptr(Error(msg));  // no reader until `done` is set
  }
  {
    std::lock_guard<std::mutex> g(mu);
    done.store(true, std::memory_order_release);
  }
  cv.notify_all();
}

void OpState::on_complete(std::function<void(std::exception_ptr)> cb) {
  std::unique_lock<std::mutex> lk(mu);
  if (!completing || (!done.load(std::memory_order_relaxed) && completer == std::this_thread::get_id())) {
    callbacks.push_back(std::move(cb));
    return;
  }
  // Finished or finishing: wait for the end (the error is final), then run it here.
  cv.wait(lk, [&] { return done.load(std::memory_order_acquire); });
  std::exception_ptr e = error;
  lk.unlock();
  cb(e);
}

}  // namespace smddp::detail

namespace smddp::engine {

Engine::Engine(bool allow_inline, Doze doze, P2pSleep fifo_sleep, P2pSleep net_sleep,
               std::function<void()> wake_collective)
    : allow_inline_(allow_inline),
      doze_(doze),
      fifo_sleep_(std::move(fifo_sleep)),
      net_sleep_(std::move(net_sleep)),
      wake_collective_(std::move(wake_collective)),
      thread_([this] { loop(); }) {}

Engine::~Engine() { shutdown(nullptr); }

size_t Engine::pending() const { return pending_.load(); }

void Engine::finish(Task& t, std::exception_ptr e) { t.state->complete(std::move(e)); }

bool& Engine::inline_on_this_thread() {
  thread_local bool on = false;
  return on;
}

namespace {
// The engines whose operations this thread is running or completing, innermost last.
std::vector<const Engine*>& held_on_this_thread() {
  thread_local std::vector<const Engine*> held;
  return held;
}

// Marks this thread as running (and completing) an operation of `e`, for nested submissions.
class Holding {
 public:
  explicit Holding(const Engine* e) { held_on_this_thread().push_back(e); }
  ~Holding() { held_on_this_thread().pop_back(); }
  Holding(const Holding&) = delete;
  Holding& operator=(const Holding&) = delete;
};
}  // namespace

const Engine*& Engine::beside_on_this_thread() {
  thread_local const Engine* e = nullptr;
  return e;
}

bool Engine::held_by_this_thread() const {
  for (const Engine* e : held_on_this_thread())
    if (e == this) return true;
  return false;
}

void Engine::check_wait_can_end(const detail::OpState& op) const {
  if (op.done.load(std::memory_order_acquire) || !held_by_this_thread()) return;
  throw Error("smddp: " + op.describe() +
              " was waited for inside a completion callback (Work::then) of the same communicator, "
              "and it is point-to-point work, queued behind some, or the collective inside whose waits "
              "the callback runs: that work progresses only after the callback returns, so this wait "
              "would never end. Wait for it after the callback, or chain it with then()");
}

void Engine::run_and_finish(Task& t) {
  Holding h(this);
  std::exception_ptr err;
  try {
    t.run();
  } catch (...) {
    err = std::current_exception();
  }
  pending_.fetch_sub(1);
  finish(t, err);
}

void Engine::run_nested_through(const detail::OpState* op) {
  if (!held_by_this_thread()) return;
  for (;;) {
    // Inside a collective on this thread, sends and receives queued since start beside it
    // (poll_p2p_beside), also those queued ahead of `op`: take them off the queue first.
    if (beside_on_this_thread() == this && !polling_beside_ && p2p_queued_beside_.load(std::memory_order_acquire))
      take_queued_p2p();
    std::unique_lock<std::mutex> lk(mu_);
    // Done already (an inner nested frame ran it), or not queued: nothing more to run for it.
    if (queue_.empty() || queue_.front().state->seq > op->seq) return;
    // Shutting down: the engine thread may be this very thread (inside a callback), so it
    // cannot fail these later; fail them here, so that the caller's wait ends.
    const bool failing = stop_;
    // Point-to-point work first in line, or running where this thread does not poll it: the
    // nested collective would wait without moving it. The ops beside the collective this thread
    // runs (its callbacks run here too) are polled from the nested one's waits as well.
    // Not from inside those polls (a collective's waits, or the poll before it starts): a
    // collective run there would run inside another, or before it.
    const size_t polled_here = beside_on_this_thread() == this && !polling_beside_ ? beside_.size() : 0;
    if (!failing && (queue_.front().p2p || p2p_running_ != polled_here)) return;
    Task t = std::move(queue_.front());
    queue_.pop_front();
    std::exception_ptr reason = stop_reason_;
    lk.unlock();
    const bool last = t.state.get() == op;
    if (failing) {
      pending_.fetch_sub(1);
      finish(t, reason);
    } else {
      run_and_finish(t);
    }
    if (last) return;
  }
}

std::optional<Task> Engine::submit(Task task) {
  task.state->engine = weak_from_this();  // empty if this engine is not owned by a shared_ptr
  pending_.fetch_add(1);
  std::unique_lock<std::mutex> lk(mu_);
  if (stop_) {
    lk.unlock();
    pending_.fetch_sub(1);
    finish(task, stop_reason_);
    return std::nullopt;
  }
  if ((allow_inline_ || inline_on_this_thread()) && !task.p2p && idle_locked()) {
    busy_ = true;
    return task;
  }
  // A dozing engine leaves a queued collective to its caller's wait() (run_here) for a tick: no
  // wake. Point-to-point work progresses on the engine thread (or a running collective's): wake it.
  const bool wake = task.p2p || task.start_now || !dozing_ || !callers_wait_;
  if (doze_.tick.count() > 0) {  // (a tick <= 0 never dozes)
    last_queued_ = std::chrono::steady_clock::now();
    task.unwoken = !wake;
    task.queued_at = last_queued_;
  }
  // A send or receive submitted while a collective runs (on the engine thread or a caller's)
  // starts from that collective's waits: its peer may take part in the collective only after it.
  const bool knock = task.p2p && busy_;
  if (knock) p2p_queued_beside_.store(true, std::memory_order_release);
  queue_.push_back(std::move(task));
  submitted_.fetch_add(1, std::memory_order_release);
  const P2pSleep* wake_p2p_sleep = p2p_sleeping_on_;
  lk.unlock();
  if (wake) cv_.notify_all();
  if (wake_p2p_sleep) wake_p2p_sleep->wake();
  if (knock && wake_collective_) wake_collective_();
  return std::nullopt;
}

void Engine::expedite(const detail::OpState* op) {
  std::unique_lock<std::mutex> lk(mu_);
  // Everything queued before it must start first: an unwoken collective ahead of `op` would
  // otherwise sit out its tick and hold `op` behind it.
  bool cleared = false;
  for (Task& t : queue_) {
    if (t.unwoken) {
      t.unwoken = false;
      cleared = true;
    }
    if (t.state.get() == op) break;
  }
  lk.unlock();
  if (cleared) cv_.notify_all();
}

bool Engine::idle_locked() const { return !busy_ && queue_.empty() && p2p_running_ == 0; }

bool Engine::run_here(const detail::OpState* op) {
  std::unique_lock<std::mutex> lk(mu_);
  if (stop_ || busy_ || queue_.empty() || p2p_running_ != 0) return false;
  if (queue_.front().p2p || queue_.front().state.get() != op) return false;
  // Sends or receives queued behind it start from its waits, here as on the engine thread.
  if (std::any_of(queue_.begin(), queue_.end(), [](const Task& t) { return t.p2p; }))
    p2p_queued_beside_.store(true, std::memory_order_release);
  Task t = std::move(queue_.front());
  queue_.pop_front();
  busy_ = true;
  callers_wait_ = true;
  lk.unlock();
  run_claimed(std::move(t));
  return true;
}

void Engine::run_claimed(Task t) {
  // Completed (callbacks run) before the next collective may start, as on the engine thread.
  // Sends and receives that another thread submits meanwhile start from its waits, as beside a
  // collective on the engine thread (which sleeps while this one runs): their peer may send or
  // receive only before its own share of this collective.
  {
    BesideOnThisThread mark(this);
    run_and_finish(t);
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (stop_ && !beside_.empty()) {
    // The engine thread is gone or going, and fails only what it holds: fail these here, before
    // the shutdown (waiting for busy_) may destroy the transports their polls withdraw from.
    std::vector<Task> unfinished = std::move(beside_);
    beside_.clear();
    p2p_running_ -= unfinished.size();
    const std::exception_ptr reason = stop_reason_;
    lk.unlock();
    {
      Holding h(this);
      fail_in_flight(unfinished, reason);
    }
    lk.lock();
  }
  hand_beside_to_loop_locked();  // those still in flight go on from the engine thread's loop
  busy_ = false;
  // Wake the engine thread only when it has something to do (work queued or handed over
  // meanwhile) or a shutdown waits for this collective: waking it for nothing cost two futex
  // calls per inline collective, and the mutex it then took was contended by the next call.
  const bool wake = !queue_.empty() || !active_p2p_.empty() || stop_;
  lk.unlock();
  if (wake) cv_.notify_all();
}

void Engine::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  int idle_polls = 0;
  for (;;) {
    if (active_p2p_.empty()) idle_wait(lk);
    if (stop_) break;
    if (!queue_.empty() && !busy_) {
      Task t = std::move(queue_.front());
      queue_.pop_front();
      if (t.p2p) {
        active_p2p_.push_back(std::move(t));
        ++p2p_running_;
        continue;
      }
      busy_ = true;
      // It sat a tick unwaited (taken after idle_wait): wake for the next ones. Not when taken
      // at once beside ops in flight.
      if (t.unwoken && active_p2p_.empty()) callers_wait_ = false;
      // A collective does not wait for the sends and receives issued before it that are still
      // in flight: their peer may send or receive only after this very collective (a pipeline
      // stage's pending irecv, then an allreduce of the same group), as gloo and NCCL allow.
      // They are polled once now (what they post moves on the network meanwhile) and then from
      // inside the collective's waits (poll_p2p_beside), on this thread. So are those queued
      // behind it, and those submitted while it runs: an async_op allreduce, then a send to a
      // peer that receives before its allreduce, would otherwise wait for each other until the
      // timeout (gloo and NCCL start the send at once). Per peer they still start in issue order.
      beside_ = std::move(active_p2p_);
      active_p2p_.clear();
      if (std::any_of(queue_.begin(), queue_.end(), [](const Task& q) { return q.p2p; }))
        p2p_queued_beside_.store(true, std::memory_order_release);
      lk.unlock();
      {
        BesideOnThisThread mark(this);
        poll_p2p_beside();
        run_and_finish(t);
      }
      lk.lock();
      hand_beside_to_loop_locked();
      busy_ = false;
      continue;
    }
    if (active_p2p_.empty()) continue;
    // Poll every active point-to-point operation once, without the lock. Whatever is submitted
    // from here on is new to this round: it ends a sleep on the ops (sleep_on_p2p).
    const uint64_t submitted = submitted_.load(std::memory_order_relaxed);
    std::vector<Task> p2p = std::move(active_p2p_);
    active_p2p_.clear();
    lk.unlock();
    bool finished = poll_p2p(p2p);
    if (!finished && !p2p.empty()) {
      // Nothing finished: back off (the poll functions watch their own deadlines). After a few
      // hundred yields, sleep until a wake-up where every op has one, else poll every 50 us.
      if (idle_polls < 256) {  // (counts no further: a receive may wait for days)
        ++idle_polls;
        sched_yield();
      } else if (const P2pSleep* sleep = sleep_for(p2p)) {
        finished = sleep_on_p2p(p2p, submitted, *sleep);
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    if (finished) idle_polls = 0;
    lk.lock();
    for (auto& t : p2p) active_p2p_.push_back(std::move(t));
  }
  // Stopping: fail whatever never ran, in issue order, holding the engine and leaving the queue
  // in place meanwhile: a failed op's callback that waits on a later op fails it itself
  // (run_nested_through) rather than wait on this thread.
  std::vector<Task> p = std::move(active_p2p_);
  std::exception_ptr reason = stop_reason_;
  lk.unlock();
  Holding h(this);
  fail_in_flight(p, reason);
  for (;;) {
    lk.lock();
    if (queue_.empty()) break;
    Task t = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    pending_.fetch_sub(1);
    finish(t, reason);
  }
}

void Engine::fail_in_flight(std::vector<Task>& ops, const std::exception_ptr& reason) {
  // The ops let go of what they hold first: an op across nodes withdraws its transfer from the
  // network as its poll goes (p2p_across_nodes.h), before a waiter or callback that hears of the
  // failure may free the buffer.
  for (auto& t : ops) t.poll = nullptr;
  for (auto& t : ops) {
    pending_.fetch_sub(1);
    finish(t, reason);
  }
  ops.clear();
}

void Engine::hand_beside_to_loop_locked() {
  // Those its waits never took (it did not wait after they came) start as usual from the loop.
  p2p_queued_beside_.store(false, std::memory_order_relaxed);
  for (auto& x : beside_) active_p2p_.push_back(std::move(x));
  beside_.clear();
}

bool Engine::poll_p2p(std::vector<Task>& ops) {
  bool finished = false;
  std::vector<Task> still;
  for (auto& t : ops) {
    std::exception_ptr err;
    bool done = false;
    try {
      done = t.poll();
    } catch (...) {
      err = std::current_exception();
      done = true;
    }
    if (!done) {
      still.push_back(std::move(t));
      continue;
    }
    pending_.fetch_sub(1);
    {
      Holding h(this);  // its callbacks may wait on this engine's work: see check_wait_can_end
      finish(t, err);
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      --p2p_running_;  // after its callbacks: a collective may run on a caller's thread from now on
    }
    finished = true;
  }
  ops = std::move(still);
  return finished;
}

bool Engine::runs_collective_here() const { return beside_on_this_thread() == this; }

bool Engine::p2p_beside_pending() const {
  return beside_on_this_thread() == this &&
         (!beside_.empty() || p2p_queued_beside_.load(std::memory_order_acquire));
}

void Engine::take_queued_p2p() {
  std::lock_guard<std::mutex> g(mu_);
  p2p_queued_beside_.store(false, std::memory_order_relaxed);
  if (stop_) return;  // the shutdown fails them, in issue order with the rest of the queue
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (!it->p2p) {
      ++it;
      continue;
    }
    beside_.push_back(std::move(*it));
    ++p2p_running_;
    it = queue_.erase(it);
  }
}

bool Engine::poll_p2p_beside() {
  if (beside_on_this_thread() != this) return false;
  if (polling_beside_) return true;  // from a callback of an op it completes: that poll goes on
  // (beside_ is being walked then: what was queued meanwhile joins at the next poll.)
  if (p2p_queued_beside_.load(std::memory_order_acquire)) take_queued_p2p();
  if (beside_.empty()) return false;
  polling_beside_ = true;
  try {
    poll_p2p(beside_);  // catches what the polls throw: each op fails on its own
  } catch (...) {
    polling_beside_ = false;
    throw;
  }
  polling_beside_ = false;
  return !beside_.empty();
}

const P2pSleep* Engine::sleep_for(const std::vector<Task>& ops) const {
  const Announcer by = ops.empty() ? Announcer::none : ops.front().announced_by;
  if (!std::all_of(ops.begin(), ops.end(), [by](const Task& t) { return t.announced_by == by; })) return nullptr;
  const P2pSleep* s = by == Announcer::node_fifos ? &fifo_sleep_ : by == Announcer::network ? &net_sleep_ : nullptr;
  return s && s->sleep ? s : nullptr;
}

bool Engine::sleep_on_p2p(std::vector<Task>& ops, uint64_t submitted, const P2pSleep& sleep) {
  // The liveness checks of the ops' polls (shm::Group::check_progress) come every 20 ms: a
  // sleep no longer than that keeps a dead peer found as soon as before.
  constexpr std::chrono::microseconds kLongest{20000};
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_ || submitted_.load(std::memory_order_relaxed) != submitted) return false;
    p2p_sleeping_on_ = &sleep;  // from here on a submit wakes the sleep
  }
  // Asked once the sleeper counts itself: an op submitted since the round began (its wake may
  // have come before the count) ends the sleep, as does an op that finishes on this last poll.
  bool finished = false;
  sleep.sleep(
      [&] {
        if (submitted_.load(std::memory_order_acquire) != submitted) return true;
        finished = poll_p2p(ops);
        return finished;
      },
      kLongest);
  std::lock_guard<std::mutex> g(mu_);
  p2p_sleeping_on_ = nullptr;
  return finished;
}

bool Engine::dozing() const {
  std::lock_guard<std::mutex> g(mu_);
  return dozing_;
}

size_t Engine::doze_ticks() const {
  std::lock_guard<std::mutex> g(mu_);
  return doze_ticks_;
}

void Engine::idle_wait(std::unique_lock<std::mutex>& lk) {
  using Clock = std::chrono::steady_clock;
  for (;;) {
    if (stop_ || !active_p2p_.empty()) return;  // (handed over by a caller's collective: run_claimed)
    auto sleep = doze_.tick;
    if (!queue_.empty() && !busy_) {
      const Task& next = queue_.front();
      if (!next.unwoken) return;
      // Queued without a wake a moment ago: its caller is likely about to run it in wait().
      // Taking it now would make that caller sleep until the engine wakes it: leave it a tick.
      const auto age = Clock::now() - next.queued_at;
      if (age >= doze_.tick) return;
      sleep = std::chrono::duration_cast<std::chrono::microseconds>(doze_.tick - age) + std::chrono::microseconds(1);
    } else if (doze_.tick.count() <= 0 || Clock::now() >= last_queued_ + doze_.window) {
      cv_.wait(lk);  // asleep until woken: an idle communicator costs no CPU
      continue;
    }
    dozing_ = true;
    ++doze_ticks_;
    cv_.wait_for(lk, sleep);
    dozing_ = false;
  }
}

void Engine::shutdown(std::exception_ptr reason) {
  const P2pSleep* wake_p2p_sleep = nullptr;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    if (!stop_reason_)
      stop_reason_ = reason ? reason
                            : std::make_exception_ptr(AbortedError("smddp: the communicator was destroyed"));
    submitted_.fetch_add(1, std::memory_order_release);  // ends a sleep on point-to-point ops
    wake_p2p_sleep = p2p_sleeping_on_;
  }
  cv_.notify_all();
  if (wake_p2p_sleep) wake_p2p_sleep->wake();
  if (thread_.joinable()) thread_.join();
  // A collective running on a caller's thread (inline or run_here) still uses the communicator,
  // which is destroyed next: wait for it (the communicator aborts it first if it must).
  // (Unless this thread is the one running it: shut down from its own callback.)
  if (held_by_this_thread()) return;
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !busy_; });
}

}  // namespace smddp::engine
