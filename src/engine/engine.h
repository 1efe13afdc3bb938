// The progress engine of one communicator: a thread that runs operations in issue order.
//
// Collectives run one at a time, to completion. Point-to-point operations are polled: a run of
// consecutive send/recv operations progresses together (batch_isend_irecv's pattern, where two
// ranks send to each other before receiving). A collective does not wait for them: it runs on
// the engine thread beside those in flight, and its waits poll them (poll_p2p_beside), since a
// peer may send or receive only after that collective (gloo and NCCL allow that). Nor do the
// sends and receives issued after it, while it runs or is queued, wait for it: they start from
// its waits too (a peer may receive only before its own share of that collective: an async_op
// allreduce, then a send). When polling
// finds nothing to do for a while, the thread sleeps
// until the node's shared memory rings (P2pSleep) where every pending op moves through it, or
// until the network's completion queue has news where every one waits on the network, and polls
// every 50 us otherwise (CUDA copies, ops of both kinds). When the engine is idle, a collective may run on the caller's
// thread instead (SMDDP_INLINE, or an InlineScope on that thread), and a caller that waits for a
// collective still first in line runs it itself (run_here): no thread hand-off, so small
// collectives have low latency. Either way one collective runs at a time (busy_), and the sends
// and receives submitted while it runs start from its waits, on whichever thread runs it.
//
// Dozing: for a while after work was queued, the idle engine thread sleeps with a timeout (a
// tick) instead of until woken. While it dozes, a newly queued collective does not wake it, and
// the engine leaves it to its caller for a tick: a caller that waits at once (torch 2.6's
// all_reduce, which does not say whether it will) runs it itself in wait() with no futex wake,
// which cost ~12 us per call on this project's VM. One that nobody waits for is started by the
// engine after a tick, and from then on queued work wakes the engine again (that caller does not
// wait at once) until a caller's wait() runs one. Point-to-point ops (only the engine progresses
// them), CUDA collectives (start_now) and expedite() always wake it; a wait() that cannot run its
// collective itself (another queued before it, a timed wait) expedites it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace smddp::engine {
class Engine;
}

namespace smddp::detail {

// Completion state shared between the engine and Work handles.
struct OpState {
  uint64_t seq = 0;
  const char* name = "operation";  // for error messages: "allreduce", "send", ...
  int rank = -1;
  // The engine that runs the operation, so that a caller who waits for a collective nobody has
  // started yet can run it itself (Engine::run_here). Weak: a Work may outlive its communicator.
  std::weak_ptr<engine::Engine> engine;
  std::shared_ptr<std::atomic<int>> source;  // receive-from-any only
  // The process's fork generation when it was issued (core/fork_generation.h): a child forked
  // since may not wait for it (its wait could run the parent's collective). kAnyProcess: unchecked.
  static constexpr uint64_t kAnyProcess = ~uint64_t{0};
  uint64_t fork_generation = kAnyProcess;
  std::atomic<bool> done{false};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;
  std::vector<std::function<void(std::exception_ptr)>> callbacks;  // guarded by mu
  bool completing = false;                                        // guarded by mu
  std::thread::id completer;  // the thread running the callbacks (guarded by mu)

  // Runs the callbacks, then wakes the waiters. A callback that throws does not stop the others;
  // if the operation itself succeeded, its waiters then get an Error naming the callback's.
  void complete(std::exception_ptr e);
  // Runs cb when complete (now, if already; what it throws then reaches the caller). From one of
  // this operation's own callbacks: after the callbacks already there (waiting for the end there
  // would wait for itself).
  void on_complete(std::function<void(std::exception_ptr)> cb);
  // "allreduce #17 on rank 0"
  std::string describe() const;
};

}  // namespace smddp::detail

namespace smddp::engine {

// How the idle engine thread sleeps (SMDDP_ENGINE_DOZE_US, SMDDP_ENGINE_DOZE_WINDOW_US).
struct Doze {
  std::chrono::microseconds tick{0};    // 0: never doze; every queued collective wakes the thread
  std::chrono::microseconds window{0};  // how long after the last queued op the thread dozes
};

// How the engine thread waits while every pending point-to-point op is one whose progress the
// same source of wake-ups announces (Task::announced_by): the communicator's shared-memory
// eventcount, which every FIFO push and pop rings, or the network's completion queue. Without
// one (or with ops of both kinds pending) the thread polls, sleeping 50 us between rounds:
// thousands of wake-ups a second (7,000 here) for as long as a receive waits.
struct P2pSleep {
  // Sleeps until woken or `timeout`, unless ready(), asked once the sleeper counts itself (so a
  // wake-up between the last poll and the sleep is not lost), is true.
  std::function<void(const std::function<bool()>& ready, std::chrono::microseconds timeout)> sleep;
  // Wakes the sleep from this process (a new op submitted, a shutdown).
  std::function<void()> wake;
};

// What announces a point-to-point op's progress, so that the engine may sleep until it rings.
enum class Announcer : uint8_t {
  none,        // polled (CUDA copies' events; a receive from any rank across nodes: two sources)
  node_fifos,  // a send or receive through this node's shared memory
  network,     // a send or receive with a rank on another node
};

struct Task {
  std::shared_ptr<detail::OpState> state;
  bool p2p = false;
  Announcer announced_by = Announcer::none;  // p2p
  // Wake a dozing engine for it: nobody will run it with run_here (a CUDA collective, whose
  // wait() makes a stream wait rather than the host).
  bool start_now = false;
  // Set by submit: queued without waking the dozing engine, at queued_at. The engine leaves it
  // to its caller's wait() for a tick before it takes it itself.
  bool unwoken = false;
  std::chrono::steady_clock::time_point queued_at{};
  std::function<void()> run;   // collective: runs to completion or throws
  // p2p: makes some progress; true when finished; throws on failure. An op the engine fails
  // unpolled (at shutdown) has its poll destroyed before its waiters hear: what the poll owns
  // withdraws from the transport as it goes.
  std::function<bool()> poll;
};

// Made with std::make_shared, so that its operations can name it (OpState::engine).
class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // `fifo_sleep`, `net_sleep`: the sleeps of ops announced by the node's FIFOs and by the
  // network (either may be empty: such ops are polled).
  // `wake_collective`: wakes the waits of a running collective (a sleep on
  // the node's doorbell or on the network) when a send or receive is submitted meanwhile, for
  // those waits to start it (poll_p2p_beside); may be empty (they find it at their next poll).
  explicit Engine(bool allow_inline, Doze doze = {}, P2pSleep fifo_sleep = {}, P2pSleep net_sleep = {},
                  std::function<void()> wake_collective = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues the task; or, when it may run on the calling thread (inline execution, or an
  // InlineScope, and the engine idle), marks the engine busy and hands it back: the caller then
  // runs it with run_claimed(), after releasing its own locks.
  [[nodiscard]] std::optional<Task> submit(Task task);
  void run_claimed(Task task);
  // A callback of an operation this thread is running or completing (a DDP comm hook such as
  // PowerSGD's, waiting on a collective it issued) submitted `op`: nobody else can run it while
  // this thread holds the engine, so run what is queued up to and including `op`, here, in
  // order. No-op on a thread that does not hold the engine. Stops at a point-to-point op first in
  // line or polled elsewhere: a callback may wait on a collective queued behind a send or recv
  // only inside a collective's run, whose waits poll them (poll_p2p_beside).
  void run_nested_through(const detail::OpState* op);
  // Whether this thread runs or completes an operation of this engine, at any depth: a callback
  // of engine A's collective may wait on B's, whose callback waits on A's again.
  bool held_by_this_thread() const;
  // For a wait on `op` that neither run_here nor run_nested_through finished: while this thread
  // holds the engine nothing else can progress `op`, so waiting would never end. Throws an
  // Error naming `op` then (a callback waiting on point-to-point work, or on a collective queued
  // behind some); returns otherwise.
  void check_wait_can_end(const detail::OpState& op) const;
  // Whether this thread's collectives run inline on an idle engine whatever the engine's own
  // setting (smddp::InlineScope sets it).
  static bool& inline_on_this_thread();
  // Runs the collective `op` on the calling thread if it is next in line and nothing runs (the
  // engine thread has not taken it yet); false otherwise, and then the caller waits as usual.
  // A caller that submits and at once waits (torch's synchronous collectives) so skips two
  // thread hand-offs, which cost 20-30 us here, against an 8-byte allreduce's 1 us.
  bool run_here(const detail::OpState* op);
  // `op`, queued, and whatever is queued before it, are to start now rather than a tick after
  // they were queued: for a caller that will not wait soon but needs it progressing (torch's
  // getFuture: DDP's buckets), and for a waiter that run_here could not serve (an op queued
  // before it, another thread's collective running, a timed wait).
  void expedite(const detail::OpState* op);
  // For tests and diagnostics: whether the thread dozes now, and how many timed sleeps it took.
  bool dozing() const;
  size_t doze_ticks() const;
  // Whether this thread runs a collective of this engine (the engine thread, or a caller's:
  // inline, run_here): sends and receives in flight, or submitted while it runs, progress only
  // from its waits, which must then poll them (poll_p2p_beside) while p2p_beside_pending().
  bool runs_collective_here() const;
  // On that thread: whether sends or receives are in flight beside the collective, or queued to
  // start beside it. Cheap (the waits of a collective with none ask it at every poll).
  bool p2p_beside_pending() const;
  // From inside such a collective's waits: starts the sends and receives queued since (in issue
  // order, also those queued behind later collectives), polls those in flight once, completing
  // the ones that finished; true while any remain. False, doing nothing, on any other thread or
  // when none are in flight or queued.
  bool poll_p2p_beside();
  // Operations submitted but not finished.
  size_t pending() const;
  // Stops the thread. Queued operations fail with `reason`; the caller must first make any
  // running operation return (the communicator aborts its transports for that).
  void shutdown(std::exception_ptr reason);

 private:
  void loop();
  // Sleeps until there is work to take or a stop; dozes (timed sleeps) within the doze window.
  void idle_wait(std::unique_lock<std::mutex>& lk);
  static void finish(Task& t, std::exception_ptr e);
  // Fails `ops`, in flight, with `reason` (holding the engine): their polls go before any waiter
  // hears. Leaves `ops` empty.
  void fail_in_flight(std::vector<Task>& ops, const std::exception_ptr& reason);
  // At a collective's end (mu_ held): the p2p ops left beside it, and the queued-beside mark, go
  // back to the loop (active_p2p_).
  void hand_beside_to_loop_locked();
  // Polls each op of `ops` once (unlocked), completing and removing those that finished; true if any did.
  bool poll_p2p(std::vector<Task>& ops);
  // The sleep that announces every op of `ops`; null when none does.
  const P2pSleep* sleep_for(const std::vector<Task>& ops) const;
  // Sleeps on `sleep` until a wake-up, an op submitted after `submitted` ops were, or its
  // timeout, polling `ops` once after it counted itself a sleeper; true if an op finished then.
  bool sleep_on_p2p(std::vector<Task>& ops, uint64_t submitted, const P2pSleep& sleep);
  // The engine whose collective this thread runs beside p2p ops in flight (beside_), or null:
  // thread-local, so no other thread reads the engine thread's state.
  static const Engine*& beside_on_this_thread();
  class BesideOnThisThread {  // sets it for a scope, restoring the one before
   public:
    explicit BesideOnThisThread(const Engine* e) : before_(beside_on_this_thread()) { beside_on_this_thread() = e; }
    ~BesideOnThisThread() { beside_on_this_thread() = before_; }
    BesideOnThisThread(const BesideOnThisThread&) = delete;
    BesideOnThisThread& operator=(const BesideOnThisThread&) = delete;

   private:
    const Engine* before_;
  };
  // Runs a collective on this thread and completes it (its callbacks run here too).
  void run_and_finish(Task& t);
  // Moves the point-to-point ops queued into beside_ (on the thread running a collective).
  void take_queued_p2p();
  // Nothing runs or waits to: no collective, no queued task, no point-to-point op in flight.
  bool idle_locked() const;

  const bool allow_inline_;
  const Doze doze_;
  const P2pSleep fifo_sleep_, net_sleep_;
  const std::function<void()> wake_collective_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::vector<Task> active_p2p_;  // the engine thread's; empty while it polls them unlocked
  // The p2p ops in flight while a collective runs, polled from its waits: the engine thread's,
  // or the caller's that runs one (run_claimed), which hands those left to the engine thread.
  std::vector<Task> beside_;
  bool polling_beside_ = false;
  // Point-to-point ops were queued while it does (or before it started, behind it): its waits
  // take them into beside_. Set under mu_; read unlocked by those waits.
  std::atomic<bool> p2p_queued_beside_{false};
  size_t p2p_running_ = 0;        // p2p ops taken off the queue, not yet completed: what other
                                  // threads must check, since active_p2p_ is empty mid-poll
  bool busy_ = false;             // a collective is running (engine thread or a caller's)
  bool stop_ = false;
  bool dozing_ = false;  // the thread sleeps with a timeout: a queued collective need not wake it
  // Whether the caller of a collective queued without a wake can be trusted to wait() at once:
  // false after the engine had to take one (it sat a tick unwaited); true again when a caller's
  // wait() runs one (run_here).
  bool callers_wait_ = true;
  size_t doze_ticks_ = 0;
  const P2pSleep* p2p_sleeping_on_ = nullptr;  // the thread sleeps there: a submit must wake it
  std::atomic<uint64_t> submitted_{0};  // ops submitted (and shutdowns): what ends a p2p sleep
  std::chrono::steady_clock::time_point last_queued_{};  // when a task was last queued
  std::exception_ptr stop_reason_;
  std::atomic<size_t> pending_{0};
  std::thread thread_;
};

}  // namespace smddp::engine
