#include "work.h"

#include <algorithm>

#ifdef SMDDP_TORCH_CUDA
#include "cuda_glue.h"
#endif

namespace smddp::torch_backend {

std::vector<c10::Device> cuda_devices_of(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const auto& t : tensors)
    if (t.defined() && t.device().is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
      devices.push_back(t.device());
  return devices;
}

void complete_future(c10::ivalue::Future& fut, const std::vector<at::Tensor>& outputs,
                     const std::vector<c10::Device>& devices) {
  // Whatever fails here (smddp's stream cannot be made: a sticky CUDA error, no memory; c10's
  // checks of the outputs' devices) fails the future rather than leaving it incomplete: the
  // work has completed already, and whoever waits on the future (DDP's comm hooks) would
  // otherwise wait forever.
  try {
#ifdef SMDDP_TORCH_CUDA
    if (!devices.empty()) return on_smddp_streams(devices, [&] { fut.markCompleted(c10::IValue(outputs)); });
#endif
    (void)devices;
    fut.markCompleted(c10::IValue(outputs));
  } catch (...) {
    fut.setErrorIfNeeded(std::current_exception());
  }
}

SmddpWork::SmddpWork(int rank, ::c10d::OpType type, std::vector<at::Tensor> outputs, std::function<void()> finalize,
                     std::vector<at::Tensor> keep_alive, uint64_t seq)
    : ::c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      finalize_(std::move(finalize)),
      keep_alive_(std::move(keep_alive)),
      seq_(seq),
      devices_(cuda_devices_of(outputs_)) {}

namespace {
const c10::TypePtr& tensor_list_type() {
  static const c10::TypePtr t = c10::ListType::create(c10::TensorType::get());
  return t;
}
}  // namespace

c10::intrusive_ptr<c10::ivalue::Future> SmddpWork::getFuture() {
  // Whoever takes the future (DDP's reducer, comm hooks) overlaps the operation with other work
  // and may never call wait(), which would run it here: start it now rather than at a dozing
  // engine's next tick.
  for (auto& op : ops_) op.expedite();
  std::lock_guard<std::mutex> g(mu_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(tensor_list_type(), devices_);
    if (done_) {
      if (first_error_) future_->setError(first_error_);
      else complete_future(*future_, outputs_, devices_);
    }
  }
  return future_;
}

c10::intrusive_ptr<SmddpWork> SmddpWork::start(int rank, ::c10d::OpType type, std::vector<smddp::Work> ops,
                                               std::vector<at::Tensor> outputs, std::function<void()> finalize,
                                               std::vector<at::Tensor> keep_alive, uint64_t seq) {
  auto w = c10::make_intrusive<SmddpWork>(rank, type, std::move(outputs), std::move(finalize), std::move(keep_alive),
                                          seq);
  if (ops.empty()) {
    w->remaining_ = 1;
    w->one_done(nullptr);
    return w;
  }
  w->remaining_ = static_cast<int>(ops.size());
  for (auto& op : ops) {
    // The callback holds a reference: the work outlives its operations even if Python drops it.
    c10::intrusive_ptr<SmddpWork> self = w;
    op.then([self](std::exception_ptr e) { self->one_done(e); });
  }
  if (w->devices_.empty()) w->ops_ = std::move(ops);
  return w;
}

bool SmddpWork::wait(std::chrono::milliseconds timeout) {
  // With a timeout, c10d's wait must be able to give up: no running a collective here, but the
  // engine starts it now rather than a dozing tick after it was queued.
  if (timeout != ::kNoTimeout) {
    for (auto& op : ops_) op.expedite();
  } else {
    for (auto& op : ops_) {
      try {
        op.wait();
      } catch (...) {
        // A failed op: one_done kept the first error, and c10d's wait below throws it. An op
        // not finished: a wait that could never end (smddp::Engine::check_wait_can_end).
        if (!op.test()) throw;
      }
    }
  }
  const bool done = ::c10d::Work::wait(timeout);
  // one_done finishes torch's side of the work just before it completes the future: a caller
  // that reads the future right after wait() (fut.value(), which asserts completion) must find
  // it complete. Its completion is set before its callbacks run, so this waits for no callback.
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> g(mu_);
    fut = future_;
  }
  if (done && fut) fut->wait();
  return done;
}

void SmddpWork::one_done(std::exception_ptr e) {
  if (e) {
    std::lock_guard<std::mutex> g(mu_);
    if (!first_error_) first_error_ = e;
  }
  if (remaining_.fetch_sub(1) != 1) return;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> g(mu_);
    err = first_error_;
  }
  if (!err && finalize_) {
    try {
      finalize_();
    } catch (...) {
      err = std::current_exception();
    }
  }
  finalize_ = nullptr;
  keep_alive_.clear();
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> g(mu_);
    first_error_ = err;
    done_ = true;
    fut = future_;
  }
  finish(err);
  if (fut) {
    if (err) fut->setError(err);
    else complete_future(*fut, outputs_, devices_);
  }
}

}  // namespace smddp::torch_backend
