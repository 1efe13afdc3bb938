// The progress engine of one communicator: a thread that runs operations in issue order.
//
// Collectives run one at a time, to completion. Point-to-point operations are polled: a run of
// consecutive send/recv operations progresses together (batch_isend_irecv's pattern, where two
// ranks send to each other before receiving), and they all finish before the next collective
// starts, as on a CUDA stream. When the engine is idle, a collective may run on the caller's
// thread instead (SMDDP_INLINE, or an InlineScope on that thread), and a caller that waits for a
// collective still first in line runs it itself (run_here): no thread hand-off, so small
// collectives have low latency. Either way one collective runs at a time (busy_).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace smddp::engine {
class Engine;
}

namespace smddp::detail {

// Completion state shared between the engine and Work handles.
struct OpState {
  uint64_t seq = 0;
  // The engine that runs the operation, so that a caller who waits for a collective nobody has
  // started yet can run it itself (Engine::run_here). Weak: a Work may outlive its communicator.
  std::weak_ptr<engine::Engine> engine;
  std::shared_ptr<std::atomic<int>> source;  // receive-from-any only
  std::atomic<bool> done{false};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;
  std::vector<std::function<void(std::exception_ptr)>> callbacks;  // guarded by mu
  bool completing = false;                                        // guarded by mu

  void complete(std::exception_ptr e);
  // Runs cb when complete (now, if already).
  void on_complete(std::function<void(std::exception_ptr)> cb);
};

}  // namespace smddp::detail

namespace smddp::engine {

struct Task {
  std::shared_ptr<detail::OpState> state;
  bool p2p = false;
  std::function<void()> run;   // collective: runs to completion or throws
  std::function<bool()> poll;  // p2p: makes some progress; true when finished; throws on failure
};

// Made with std::make_shared, so that its operations can name it (OpState::engine).
class Engine : public std::enable_shared_from_this<Engine> {
 public:
  explicit Engine(bool allow_inline);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void submit(Task task);
  // Whether this thread's collectives run inline on an idle engine whatever the engine's own
  // setting (smddp::InlineScope sets it).
  static bool& inline_on_this_thread();
  // Runs the collective `op` on the calling thread if it is next in line and nothing runs (the
  // engine thread has not taken it yet); false otherwise, and then the caller waits as usual.
  // A caller that submits and at once waits (torch's synchronous collectives) so skips two
  // thread hand-offs, which cost 20-30 us here, against an 8-byte allreduce's 1 us.
  bool run_here(const detail::OpState* op);
  // Operations submitted but not finished.
  size_t pending() const;
  // Stops the thread. Queued operations fail with `reason`; the caller must first make any
  // running operation return (the communicator aborts its transports for that).
  void shutdown(std::exception_ptr reason);

 private:
  void loop();
  static void finish(Task& t, std::exception_ptr e);
  // Runs a collective taken off the queue (busy_ set) on the calling thread, then completes it.
  void run_on_caller(Task t, std::unique_lock<std::mutex>& lk);

  const bool allow_inline_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::vector<Task> active_p2p_;  // owned by the engine thread
  bool busy_ = false;             // a collective is running (engine thread or a caller's)
  bool stop_ = false;
  std::exception_ptr stop_reason_;
  std::atomic<size_t> pending_{0};
  std::thread thread_;
};

}  // namespace smddp::engine
