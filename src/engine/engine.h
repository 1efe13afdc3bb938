// The progress engine of one communicator: a thread that runs operations in issue order.
//
// Collectives run one at a time, to completion. Point-to-point operations are polled: a run of
// consecutive send/recv operations progresses together (batch_isend_irecv's pattern, where two
// ranks send to each other before receiving), and they all finish before the next collective
// starts, as on a CUDA stream. When the engine is idle, a collective may run on the caller's
// thread instead (SMDDP_INLINE): no thread hand-off, so small collectives have low latency.
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

namespace smddp::detail {

// Completion state shared between the engine and Work handles.
struct OpState {
  uint64_t seq = 0;
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

class Engine {
 public:
  explicit Engine(bool allow_inline);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void submit(Task task);
  // Operations submitted but not finished.
  size_t pending() const;
  // Stops the thread. Queued operations fail with `reason`; the caller must first make any
  // running operation return (the communicator aborts its transports for that).
  void shutdown(std::exception_ptr reason);

 private:
  void loop();
  static void finish(Task& t, std::exception_ptr e);

  const bool allow_inline_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::vector<Task> active_p2p_;  // owned by the engine thread
  bool busy_ = false;             // a collective is running (engine thread or inline)
  bool stop_ = false;
  std::exception_ptr stop_reason_;
  std::atomic<size_t> pending_{0};
  std::thread thread_;
};

}  // namespace smddp::engine
