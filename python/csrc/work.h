// c10d::Work for smddp: completes when every underlying smddp operation has completed and the
// results were copied to where PyTorch expects them; its Future (getFuture, used by DDP's comm
// hooks) then completes with the output tensors.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>
#include <vector>

#include "smddp/communicator.h"

namespace smddp::torch_backend {

// The CUDA devices of `tensors`, each once: a future holding CUDA tensors must name them (c10's
// Future checks), so that a callback chained on it (DDP's comm hooks) is ordered after the data.
std::vector<c10::Device> cuda_devices_of(const std::vector<at::Tensor>& tensors);

// Completes `fut` with `outputs`, whose data has landed; on CUDA devices its events are recorded
// on smddp's streams (cuda_glue.h), not on this thread's current ones.
void complete_future(c10::ivalue::Future& fut, const std::vector<at::Tensor>& outputs,
                     const std::vector<c10::Device>& devices);

class SmddpWork final : public ::c10d::Work {
 public:
  // `finalize` runs once all `ops` succeeded (on the thread that completes the last one),
  // before the work and its future complete: it copies staging buffers back into the user's
  // tensors. `keep_alive` holds every tensor whose memory the operations use.
  static c10::intrusive_ptr<SmddpWork> start(int rank, ::c10d::OpType type, std::vector<smddp::Work> ops,
                                             std::vector<at::Tensor> outputs, std::function<void()> finalize,
                                             std::vector<at::Tensor> keep_alive, uint64_t seq);

  SmddpWork(int rank, ::c10d::OpType type, std::vector<at::Tensor> outputs, std::function<void()> finalize,
            std::vector<at::Tensor> keep_alive, uint64_t seq);

  std::vector<at::Tensor> result() override { return outputs_; }
  // For a CPU work: first runs, on this thread, each of its collectives that no engine thread
  // has started yet (smddp::Work::wait), then waits as c10d does. torch's synchronous
  // collectives wait as soon as they issue, so the engine's two thread hand-offs (most of an
  // 8-byte allreduce's time through torch here) are skipped, while async_op=True still returns
  // at once and overlaps. CUDA works keep c10d's wait.
  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  // Made on first request (most callers only wait()), completed at once if the work is done.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return seq_; }
  // recv from any source: which rank sent the message (c10d's Work::sourceRank).
  int sourceRank() const override { return source_ ? source_() : ::c10d::Work::sourceRank(); }
  void set_source(std::function<int()> f) { source_ = std::move(f); }

 private:
  void one_done(std::exception_ptr e);

  std::vector<smddp::Work> ops_;  // a CPU work's operations, for wait() to run (else empty)
  std::vector<at::Tensor> outputs_;
  std::function<void()> finalize_;
  std::vector<at::Tensor> keep_alive_;
  std::atomic<int> remaining_{0};
  std::mutex mu_;  // guards first_error_, future_, done_
  std::exception_ptr first_error_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool done_ = false;
  uint64_t seq_;
  std::function<int()> source_;
  std::vector<c10::Device> devices_;  // the CUDA devices of the outputs (the future's)
};

}  // namespace smddp::torch_backend
