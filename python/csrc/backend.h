// ProcessGroupSmddp: the c10d::Backend behind `init_process_group(backend="smddp")`.
// Every collective PyTorch can ask for maps to the smddp core; each call returns a SmddpWork
// whose Future completes with the output tensors.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <vector>

#include "backend_internal.h"
#include "tensor_args.h"
#include "smddp/communicator.h"
#include "smddp/errors.h"
#include "work.h"

namespace smddp::torch_backend {

class ProcessGroupSmddp final : public ::c10d::Backend {
 public:
  // local_rank: the process's LOCAL_RANK for a subgroup, which picks its NIC there (< 0: the
  // communicator's own topology decides; smddp::Options::local_rank, launch_env.local_rank_for_group).
  ProcessGroupSmddp(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout, int local_rank = -1);
  ~ProcessGroupSmddp() override;
  // The last strong reference is gone (a weak one may remain: a parent's last_split_): the
  // communicator ends now, as the destructor would end it.
  void release_resources() override;

  // The creator that smddp/__init__.py registers with torch.distributed.Backend.register_backend.
  static c10::intrusive_ptr<::c10d::Backend> create(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                                    int size, const std::chrono::duration<float>& timeout,
                                                    int local_rank = -1);

  const std::string getBackendName() const override { return "smddp"; }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                       const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs, const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                        const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits,
                                                 const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void startCoalescing() override;
  c10::intrusive_ptr<::c10d::Work> endCoalescing() override;

#ifdef SMDDP_TORCH_SPLIT
  // Backend splitting (backend_split.cc): torch's split_group, and init_device_mesh where the
  // default group is bound to a device (init_process_group(device_id=...)), make subgroups by
  // calling split() on every rank of the parent. A member gets a new communicator over the
  // members alone, made from the store torch passes; a rank outside the new group gets null.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<::c10d::Backend::Options> getBackendOptions() override;
  c10::intrusive_ptr<::c10d::Backend> split(const c10::intrusive_ptr<::c10d::Store>& store,
                                            const std::vector<int>& ranks,
                                            const c10::intrusive_ptr<::c10d::Backend::Options>& opts) override;
#endif

 private:
  // Wraps finished submissions into the Work PyTorch gets (and records it when coalescing).
  c10::intrusive_ptr<::c10d::Work> make_work(::c10d::OpType type, std::vector<smddp::Work> ops,
                                            std::vector<at::Tensor> outputs, std::function<void()> finalize,
                                            std::vector<at::Tensor> keep_alive);
  c10::intrusive_ptr<::c10d::Work> finish(::c10d::OpType type, Pending p);
  // Runs `submit`, turning the core's exceptions into PyTorch errors (RuntimeError in Python).
  template <class F>
  c10::intrusive_ptr<::c10d::Work> guarded(const char* coll, F&& submit) {
    try {
      return submit();
    } catch (const smddp::Error& e) {
      TORCH_CHECK(false, e.what());
    }
  }
  // The same for a collective with options: torch >= 2.7 says in them whether the caller waits
  // at once (asyncOp false, torch's synchronous calls; 2.6 for some collectives); then the
  // collective runs on the calling thread when nothing is queued before it (smddp::InlineScope).
  // An async_op=True call still goes to the engine thread and overlaps with the caller.
  template <class Opts, class F>
  c10::intrusive_ptr<::c10d::Work> guarded(const char* coll, const Opts& opts, F&& submit) {
    bool caller_waits = false;
    if constexpr (requires { opts.asyncOp; }) caller_waits = !opts.asyncOp;
    smddp::InlineScope scope(caller_waits);
    return guarded(coll, std::forward<F>(submit));
  }
  Pending allreduce_one(const at::Tensor& t, const Reduction& red, const char* coll);
  Pending sparse_allreduce_one(const at::Tensor& t, const Reduction& red);  // backend_sparse.cc
  Pending reduce_scatter_one(const at::Tensor& out, const at::Tensor& flat_in, const Reduction& red, const char* coll);
  Pending allgather_one(const at::Tensor& out_flat, const at::Tensor& in, const char* coll);
  // The checks of the two above, alone: a coalesced call checks every pair before it submits the
  // first, so a wrong pair fails the call with nothing written.
  Elems check_reduce_scatter(const at::Tensor& out, const at::Tensor& flat_in, const Reduction& red,
                             const char* coll) const;
  Elems check_allgather(const at::Tensor& out_flat, const at::Tensor& in, const char* coll) const;

  void end_communicator() noexcept;  // joins its engine thread without holding the GIL

  std::unique_ptr<smddp::Communicator> comm_;
  uint64_t seq_ = 0;
  // The last split: a ProcessGroup::splitGroup that calls split() once per device type the
  // parent has a backend for (torch 2.14 asks a member once; a loop over device types asks it
  // for cpu and again for cuda, which this one backend both serves) must get the same group the
  // second time, not rendezvous again under the same keys. Weak: the child's communicator ends
  // when torch drops the group (release_resources), whatever this reference.
  std::string last_split_name_;
  c10::weak_intrusive_ptr<::c10d::Backend> last_split_{c10::intrusive_ptr<::c10d::Backend>()};
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<::c10d::Work>> coalesced_;
};

}  // namespace smddp::torch_backend
