// Construction, work bookkeeping, and the reductions (allreduce, reduce, reduce_scatter).
#include "backend.h"

#include <ATen/ThreadLocalState.h>
#include <ATen/core/LegacyTypeDispatch.h>

#include <Python.h>

#include "backend_internal.h"
#include "core/config.h"
#ifdef SMDDP_TORCH_CUDA
#include "cuda_glue.h"
#endif
#include "store_adapter.h"
#include "tensor_args.h"

namespace smddp::torch_backend {

ProcessGroupSmddp::ProcessGroupSmddp(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                     std::chrono::milliseconds timeout, int local_rank)
    : ::c10d::Backend(rank, size) {
  smddp::Options o;
  o.timeout = timeout;
  o.name = "torch";
  if (local_rank >= 0) o.local_rank = local_rank;
  // async_op=True calls go to the engine thread and return at once (DDP overlaps its buckets
  // with the backward pass; ranks issuing to two groups in different orders must not block each
  // other); synchronous ones run inline anyway (guarded(), InlineScope). SMDDP_INLINE=1 runs
  // every call inline when the engine is idle.
  if (!smddp::config::is_set("SMDDP_INLINE")) o.inline_execution = false;
  comm_ = std::make_unique<smddp::Communicator>(std::make_shared<C10dStore>(store), rank, size, o);
}

ProcessGroupSmddp::~ProcessGroupSmddp() { end_communicator(); }

void ProcessGroupSmddp::release_resources() { end_communicator(); }  // (c10d::Backend has none of its own)

void ProcessGroupSmddp::end_communicator() noexcept {
  if (!comm_) return;
  // The communicator's destructor joins its engine thread, and that thread may need the GIL to
  // finish: it runs Python callbacks of a Work's future, and when it drops the last reference to
  // a tensor whose Python object the C++ side keeps alive, freeing that object takes the GIL.
  // Destroyed from Python (destroy_process_group, or the last reference going), this thread
  // holds the GIL: keeping it while joining made the two wait for each other forever (#17).
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* saved = PyEval_SaveThread();
    comm_.reset();
    PyEval_RestoreThread(saved);
  } else {
    comm_.reset();
  }
}

c10::intrusive_ptr<::c10d::Backend> ProcessGroupSmddp::create(const c10::intrusive_ptr<::c10d::Store>& store,
                                                              int rank, int size,
                                                              const std::chrono::duration<float>& timeout,
                                                              int local_rank) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  if (ms.count() <= 0) ms = std::chrono::minutes(30);
  return c10::make_intrusive<ProcessGroupSmddp>(store, rank, size, ms, local_rank);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::make_work(::c10d::OpType type, std::vector<smddp::Work> ops,
                                                             std::vector<at::Tensor> outputs,
                                                             std::function<void()> finalize,
                                                             std::vector<at::Tensor> keep_alive) {
  auto w = SmddpWork::start(getRank(), type, std::move(ops), std::move(outputs), std::move(finalize),
                            std::move(keep_alive), ++seq_);
  if (coalescing_) coalesced_.push_back(w);
  return w;
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::finish(::c10d::OpType type, Pending p) {
  auto fins = std::move(p.finalizers);
  std::function<void()> finalize;
  // The copies back into the user's tensors run on whichever thread completes the collective,
  // usually the engine's: under the caller's thread-local state from the call (inference mode,
  // grad mode, ...), as gloo's worker runs since torch's #142184, and below autograd's in-place
  // checks, since they put the collective's result in the user's memory as gloo writes it there
  // directly. Without either, an async all_gather under torch.inference_mode() failed ("Inplace
  // update to inference tensor outside InferenceMode"), and so did a staged (non-contiguous)
  // leaf that requires grad, such as a channels_last weight.
  if (!fins.empty())
    finalize = [fins = std::move(fins), tls = at::ThreadLocalState()] {
      at::ThreadLocalStateGuard caller(tls);
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      for (auto& f : fins) f();
    };
#ifdef SMDDP_TORCH_CUDA
  // The copies back into the user's tensors run on the thread that completes the collective
  // (the engine's, or the caller's for a synchronous call): on the outputs' GPU, and landed
  // before the work completes.
  int gpu = -1;
  for (auto& t : p.outputs)
    if (t.defined() && t.device().is_cuda()) gpu = t.device().index();
  if (finalize && gpu >= 0) finalize = [gpu, f = std::move(finalize)] { run_on_cuda_device(gpu, f); };
#endif
  std::vector<smddp::Work> ops = p.take_ops();
  return make_work(type, std::move(ops), std::move(p.outputs), std::move(finalize), std::move(p.keep_alive));
}

void Pending::drain() noexcept {
  if (ops.empty()) return;
  // The engine thread may need the GIL to finish (it frees tensors Python holds): never wait
  // for it holding the GIL (as ~ProcessGroupSmddp does).
  PyThreadState* saved = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  for (auto& w : ops) {
    try {
      w.wait();
    } catch (...) {  // the error that unwound this call is the one the caller sees
    }
  }
  if (saved) PyEval_RestoreThread(saved);
  ops.clear();
}

void ProcessGroupSmddp::startCoalescing() {
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::endCoalescing() {
  coalescing_ = false;
  auto works = std::move(coalesced_);
  coalesced_.clear();
  // One work that completes when every coalesced one has: wait on each in turn.
  std::vector<at::Tensor> outputs;
  for (auto& w : works)
    for (auto& t : w->result()) outputs.push_back(t);
  // The future names the outputs' GPUs, as each work's does: made without them, c10's Future
  // takes CUDA tensors unchecked and records no events for them (nothing read early, since the
  // data had landed, but the one future that broke torch's contract for CUDA values).
  const std::vector<c10::Device> devices = cuda_devices_of(outputs);
  auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  if (works.empty()) {
    complete_future(*fut, outputs, devices);
    return ::c10d::Work::create_from_future(fut);
  }
  auto remaining = std::make_shared<std::atomic<size_t>>(works.size());
  for (auto& w : works) {
    w->getFuture()->addCallback([remaining, fut, outputs, devices](c10::ivalue::Future& f) {
      if (f.hasError()) {
        if (!fut->completed()) fut->setErrorIfNeeded(f.exception_ptr());
      } else if (remaining->fetch_sub(1) == 1 && !fut->completed()) {
        complete_future(*fut, outputs, devices);
      }
    });
  }
  return ::c10d::Work::create_from_future(fut);
}

// ---------------------------------------------------------------------------------------------
// Reductions

Pending ProcessGroupSmddp::allreduce_one(const at::Tensor& t, const Reduction& red, const char* coll) {
  check_tensor(t, coll, getRank());
  Elems e = reduction_elems(t, red, coll, getRank());
  Pending p;
  Staged s = stage(t.is_complex() ? at::view_as_real(t) : t);
  p.ops.push_back(comm_->allreduce(s.data(), s.data(), e.count, e.dtype, red, memory_of(s.tensor)));
  p.outputs.push_back(t);
  p.keep_alive.push_back(s.tensor);
  if (s.copied) p.finalizers.push_back([s] { s.copy_back(); });
  return p;
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::allreduce(std::vector<at::Tensor>& tensors,
                                                             const ::c10d::AllreduceOptions& opts) {
  return guarded("allreduce", opts, [&] {
    if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse())
      return finish(::c10d::OpType::ALLREDUCE,
                    sparse_allreduce_one(tensors[0], to_reduction(opts.reduceOp, "allreduce")));
    check_single(tensors, "allreduce", getRank());
    return finish(::c10d::OpType::ALLREDUCE, allreduce_one(tensors[0], to_reduction(opts.reduceOp, "allreduce"),
                                                           "allreduce"));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const ::c10d::AllreduceCoalescedOptions& opts) {
  return guarded("allreduce_coalesced", opts, [&] {
    const Reduction red = to_reduction(opts.reduceOp, "allreduce_coalesced");
    if (tensors.empty()) return finish(::c10d::OpType::ALLREDUCE_COALESCED, Pending{});
    // Same dtype: one flat buffer, one allreduce. Mixed dtypes: one allreduce per tensor.
    bool same = true;
    for (auto& t : tensors) {
      check_tensor(t, "allreduce_coalesced", getRank());
      check_same_device(t, tensors[0], "allreduce_coalesced", getRank());
      same = same && t.scalar_type() == tensors[0].scalar_type();
    }
    Pending all;
    if (!same) {
      // All of them, before the first goes.
      for (auto& t : tensors) reduction_elems(t, red, "allreduce_coalesced", getRank());
      for (auto& t : tensors) all.merge(allreduce_one(t, red, "allreduce_coalesced"));
      return finish(::c10d::OpType::ALLREDUCE_COALESCED, std::move(all));
    }
    // One allreduce over the parts back to back; the ranks also agree on each part's size.
    std::vector<at::Tensor> flat_parts;
    std::vector<size_t> parts;
    for (auto& t : tensors) {
      flat_parts.push_back(t.reshape({-1}));
      parts.push_back(reduction_elems(t, red, "allreduce_coalesced", getRank()).count);
    }
    at::Tensor flat = at::cat(flat_parts);
    Elems e = reduction_elems(flat, red, "allreduce_coalesced", getRank());
    at::Tensor buf = flat.is_complex() ? at::view_as_real(flat) : flat;
    Pending p;
    p.ops.push_back(comm_->allreduce_coalesced(buf.data_ptr(), buf.data_ptr(), parts, e.dtype, red, memory_of(buf)));
    p.keep_alive.push_back(buf);
    p.outputs = tensors;
    p.finalizers.push_back([flat, tensors] {
      int64_t off = 0;
      for (auto& t : tensors) {
        t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
      }
    });
    return finish(::c10d::OpType::ALLREDUCE_COALESCED, std::move(p));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::reduce(std::vector<at::Tensor>& tensors,
                                                          const ::c10d::ReduceOptions& opts) {
  return guarded("reduce", opts, [&] {
    check_single(tensors, "reduce", getRank());
    const Reduction red = to_reduction(opts.reduceOp, "reduce");
    const at::Tensor& t = tensors[0];
    Elems e = reduction_elems(t, red, "reduce", getRank());
    const int root = static_cast<int>(opts.rootRank);
    Staged s = stage(t.is_complex() ? at::view_as_real(t) : t);
    Pending p;
    p.ops.push_back(comm_->reduce(s.data(), getRank() == root ? s.data() : nullptr, e.count, e.dtype, red, root,
                                   memory_of(s.tensor)));
    p.outputs.push_back(t);
    p.keep_alive.push_back(s.tensor);
    if (s.copied && getRank() == root) p.finalizers.push_back([s] { s.copy_back(); });
    return finish(::c10d::OpType::REDUCE, std::move(p));
  });
}

Elems ProcessGroupSmddp::check_reduce_scatter(const at::Tensor& out, const at::Tensor& flat_in, const Reduction& red,
                                               const char* coll) const {
  check_tensor(out, coll, getRank());
  check_tensor(flat_in, coll, getRank());
  check_same_type(out, flat_in, coll, getRank());
  check_same_device(out, flat_in, coll, getRank());
  if (flat_in.numel() != out.numel() * getSize())
    throw InvalidArgument("smddp: rank " + std::to_string(getRank()) + ": " + coll + ": input has " +
                          std::to_string(flat_in.numel()) + " elements, expected output's " +
                          std::to_string(out.numel()) + " x world size " + std::to_string(getSize()));
  return reduction_elems(out, red, coll, getRank());
}

Pending ProcessGroupSmddp::reduce_scatter_one(const at::Tensor& out, const at::Tensor& flat_in, const Reduction& red,
                                              const char* coll) {
  const Elems e = check_reduce_scatter(out, flat_in, red, coll);
  Staged in = stage(out.is_complex() ? at::view_as_real(flat_in) : flat_in);
  Staged o = stage(out.is_complex() ? at::view_as_real(out) : out);
  Pending p;
  p.ops.push_back(comm_->reduce_scatter(in.data(), o.data(), e.count, e.dtype, red, memory_of(o.tensor)));
  p.outputs.push_back(out);
  p.keep_alive = {in.tensor, o.tensor};
  if (o.copied) p.finalizers.push_back([o] { o.copy_back(); });
  return p;
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const ::c10d::ReduceScatterOptions& opts) {
  return guarded("reduce_scatter", opts, [&] {
    check_single(outputs, "reduce_scatter", getRank());
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize())
      throw InvalidArgument("smddp: rank " + std::to_string(getRank()) +
                            ": reduce_scatter needs one list of world-size input tensors");
    std::vector<at::Tensor> parts;
    for (auto& t : inputs[0]) {
      check_tensor(t, "reduce_scatter", getRank());
      // Each one: at::cat below would promote a list of mixed dtypes to their common one.
      check_same_type(outputs[0], t, "reduce_scatter", getRank());
      check_same_device(t, outputs[0], "reduce_scatter", getRank());
      if (t.numel() != outputs[0].numel())
        throw InvalidArgument("smddp: rank " + std::to_string(getRank()) +
                              ": reduce_scatter: every input must have the output's size (" +
                              std::to_string(outputs[0].numel()) + " elements), one has " +
                              std::to_string(t.numel()));
      parts.push_back(t.reshape({-1}));
    }
    return finish(::c10d::OpType::REDUCE_SCATTER,
                  reduce_scatter_one(outputs[0], at::cat(parts), to_reduction(opts.reduceOp, "reduce_scatter"),
                                     "reduce_scatter"));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const ::c10d::ReduceScatterOptions& opts) {
  return guarded("reduce_scatter_tensor", opts, [&] {
    return finish(::c10d::OpType::_REDUCE_SCATTER_BASE,
                  reduce_scatter_one(output, input, to_reduction(opts.reduceOp, "reduce_scatter_tensor"),
                                     "reduce_scatter_tensor"));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const ::c10d::ReduceScatterOptions& opts) {
  return guarded("reduce_scatter_tensor_coalesced", opts, [&] {
    if (outputs.size() != inputs.size())
      throw InvalidArgument("smddp: reduce_scatter_tensor_coalesced: as many outputs as inputs needed");
    const Reduction red = to_reduction(opts.reduceOp, "reduce_scatter_tensor_coalesced");
    for (size_t i = 0; i < outputs.size(); ++i) {
      check_reduce_scatter(outputs[i], inputs[i], red, "reduce_scatter_tensor_coalesced");
      check_same_device(outputs[i], outputs[0], "reduce_scatter_tensor_coalesced", getRank());
    }
    Pending all;
    for (size_t i = 0; i < outputs.size(); ++i)
      all.merge(reduce_scatter_one(outputs[i], inputs[i], red, "reduce_scatter_tensor_coalesced"));
    return finish(::c10d::OpType::COALESCED, std::move(all));
  });
}

}  // namespace smddp::torch_backend
