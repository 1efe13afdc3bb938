// Sleeping until a completion queue has news, for the engine thread while every pending
// point-to-point op waits on the network (a pipeline stage waiting for activations from another
// node, a rank whose peer there sends late). Where the provider gives the queue a wait object
// (FI_WAIT_FD: tcp, tcp;ofi_rxm) the sleeper blocks in poll(2) on it and on an eventfd that
// wake() writes; libfabric's fi_trywait, called first, says whether that is safe (nothing already
// queued that the fd would not announce). Elsewhere (efa's queues have no wait object; or
// SMDDP_OFI_WAIT=poll; efa by default) each sleep is 50 us, the polling the engine always did:
// about 7,000 wake-ups a second here for as long as the op waits.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>  // enum fi_wait_obj

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

namespace smddp::ofi {

// The wait object to ask for when opening a completion queue of `provider`: SMDDP_OFI_WAIT=auto
// (the default) asks FI_WAIT_FD of tcp and tcp;ofi_rxm, where it was measured, and none of
// others (efa, verbs: whether their fd announces every completion is untried, and a missed one
// costs a sleep's 20 ms); fd asks it of every provider (those without fall back to none); poll
// of none.
enum fi_wait_obj wanted_wait_object(const std::string& provider);

// One sleeper at a time (one flag, one eventfd, and fi_trywait clears the queue's signal): the
// engine thread's, or a collective's, never both, since the engine polls no point-to-point op
// while a collective runs.
class CompletionWait {
 public:
  // `cq` was opened with `wait_obj`; null fabric or cq: never blocks.
  CompletionWait(fid_fabric* fabric, fid_cq* cq, enum fi_wait_obj wait_obj);
  ~CompletionWait();
  CompletionWait(const CompletionWait&) = delete;
  CompletionWait& operator=(const CompletionWait&) = delete;

  // Whether sleep() blocks on the queue's fd (else it sleeps 50 us at a time).
  bool blocks() const { return cq_fd_ >= 0; }
  // fi_trywait on the queue: true when a sleep may block on its fd. Under the domain's lock.
  bool trywait();
  // Sleeps until the queue's fd is readable, wake() is called or `timeout` passes, unless
  // ready(), asked once the sleeper counts itself (a wake() between the caller's last poll and
  // the sleep is not lost), is true. may_block() (the caller's trywait, under its lock, and its
  // own conditions) false: 50 us at most instead.
  void sleep(const std::function<bool()>& ready, const std::function<bool()>& may_block,
             std::chrono::microseconds timeout);
  // Ends a sleep from another thread of this process (an op submitted, a shutdown).
  void wake();

 private:
  fid_fabric* fabric_;
  fid_cq* cq_;
  int cq_fd_ = -1;
  int event_fd_ = -1;
  std::atomic<bool> sleeping_{false};
};

}  // namespace smddp::ofi
