// What an algorithm sees of the network: post sends and receives to global ranks by step, then
// wait for all of them. Tags are derived from the operation's sequence number and the step, so
// messages of different collectives or steps never match each other, whatever order the fabric
// delivers them in.
//
// The network reads and writes memory behind the device's back: every post fences the device
// first (Device::fence, free on the host), so a send carries what the device wrote before it,
// not what is still queued, and a receive cannot land in a buffer that a queued copy or
// reduction (an earlier slice's, in the same scratch) still reads or writes. The algorithms
// therefore never fence for the network, as they never fence for their node's peers
// (Context::arrive).
//
// Device memory the network cannot reach (Context::bounce set, Device::network_reaches false)
// goes through host buffers of the bounce pool: a send copies its bytes there on the device and
// posts them once they landed; a receive lands there, and wait() copies it to its destination on
// the device, after which the device's later work (a reduction of it) is queued. The algorithm
// sees no difference.
#pragma once

#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/bounce_pool.h"
#include "transport/ofi/endpoint.h"

namespace smddp::algorithms {

class NetExchange {
 public:
  explicit NetExchange(Context& ctx)
      : ep_(*ctx.net), dev_(ctx.dev), op_(ctx.op), watch_(ctx.watch), beside_(ctx.beside), publish_failure_(ctx.publish_failure),
        give_up_(ctx.cancels_give_up), bounce_(ctx.bounce) {}
  // Left with transfers pending only when the collective failed: they are cancelled, so nothing
  // arrives later in buffers the caller may free (the bounce buffers go back after this body).
  ~NetExchange() {
    if (pending_.empty()) return;
    try {
      if (give_up_ == std::chrono::steady_clock::time_point{})
        give_up_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      ep_.cancel(pending_, give_up_);
    } catch (...) {  // a destructor must not throw; the collective's own error is on its way
    }
  }
  NetExchange(const NetExchange&) = delete;
  NetExchange& operator=(const NetExchange&) = delete;

  void send(int peer, const void* buf, size_t bytes, uint32_t step) {
    if (bounces(buf, bytes)) {
      leases_.push_back(bounce_->lease(bytes));
      dev_.copy(leases_.back().data(), buf, bytes);  // after the device's earlier work on buf
      buf = leases_.back().data();
    }
    dev_.fence();
    pending_.push_back(ep_.send(peer, buf, bytes, tag(step)));
  }
  void recv(int peer, void* buf, size_t bytes, uint32_t step) {
    if (bounces(buf, bytes)) {
      leases_.push_back(bounce_->lease(bytes));
      landings_.push_back({buf, leases_.back().data(), bytes});
      buf = leases_.back().data();  // the device's queued work never touches it: no fence
    } else {
      dev_.fence();
    }
    pending_.push_back(ep_.recv(peer, buf, bytes, tag(step)));
  }
  // Flow control for one-way collectives (broadcast and scatter from the root, reduce and gather
  // to it): a receiver posts its receive, then tells the sender it is ready; the sender waits for
  // that before sending. Without it a sender whose sends complete locally (eager messages) could
  // run any number of collectives ahead of a slow receiver, each one held by the receiver's
  // provider as unexpected messages: memory without bound. With it a sender is at most one
  // collective ahead, and the only message that can arrive unexpected is the 0-byte token.
  void ready(int sender) { pending_.push_back(ep_.send(sender, nullptr, 0, ready_tag())); }
  void await_ready(int receiver) { pending_.push_back(ep_.recv(receiver, nullptr, 0, ready_tag())); }

  // The step of the cross-node fingerprint exchange (core/cross_node_agreement.cc), which runs
  // before the algorithm: a value no algorithm's step reaches, sent as 0xFFE.
  static constexpr uint32_t kAgreementStep = 0xFFFFFFFFu;
  // The 12 bits of a tag that carry `step`: algorithms' own steps wrap below 0xFFE (step 4094 of
  // a hierarchical reduce_scatter of 16 GiB, slice 2047 of an allreduce of 8 GiB had the
  // fingerprint exchange's 0xFFE: harmless only while those messages are consumed first);
  // 0xFFE is the fingerprint exchange's, 0xFFF the ready token's.
  static constexpr uint32_t step_field(uint32_t step) { return step == kAgreementStep ? 0xFFE : step % 0xFFE; }

  // Waits for everything posted so far (deadline: the operation's). A failure is published
  // before this object's destructor cancels what is still posted (Context::publish_failure).
  void wait() {
    try {
      for (auto& h : pending_) ep_.wait(h, op_, watch_, beside_);
    } catch (...) {
      Context::rethrow_published(publish_failure_, std::current_exception());
    }
    pending_.clear();
    // Bounced receives to their destinations, queued on the device before whatever the
    // algorithm does with them next; the bounce buffers go back once the copies read them.
    for (const Landing& l : landings_) dev_.copy(l.dst, l.src, l.bytes);
    if (!leases_.empty()) dev_.fence();
    landings_.clear();
    leases_.clear();
  }

 private:
  // Bit 31 marks collective traffic; point-to-point tags stay below it.
  uint32_t tag(uint32_t step) const { return base() | step_field(step); }
  uint32_t ready_tag() const { return base() | 0xFFF; }
  uint32_t base() const { return 0x80000000u | static_cast<uint32_t>((op_.coll_seq & 0x7FFFF) << 12); }
  bool bounces(const void* buf, size_t bytes) const { return bounce_ && bytes > 0 && !dev_.network_reaches(buf); }
  struct Landing {
    void* dst;
    const std::byte* src;
    size_t bytes;
  };
  ofi::Endpoint& ep_;
  device::Device& dev_;
  const OpInfo& op_;
  const std::function<void()>* watch_;
  const std::function<bool()>* beside_;
  const std::function<std::exception_ptr(std::exception_ptr)>* publish_failure_;
  std::chrono::steady_clock::time_point& give_up_;  // Context::cancels_give_up
  BouncePool* bounce_;
  std::vector<ofi::Endpoint::Handle> pending_;
  std::vector<BouncePool::Lease> leases_;  // the bounce buffers of the messages posted
  std::vector<Landing> landings_;          // bounced receives, copied out by wait()
};

// Whether a multi-stage avg on `t` averages at every stage (a node's partial is the mean of its
// ranks', the last stage the mean of the nodes' means) instead of summing until one division by
// the world size: on f16/bf16, whose partials are stored in the dtype, a node's sum overflows
// where every mean fits (8 ranks' 10000 make 80000, past f16's 65504, and inf / 16 stays inf;
// the flat algorithms, summing in float, gave 10000). The mean of the means is the mean only
// where every node has as many ranks, as the hierarchical algorithms require. Integers keep the
// one division (truncated once), and f32/f64 too (their partial sums stay far inside the range).
inline bool averages_by_stage(Reduction r, DataType t) {
  return r.op == ReduceOp::avg && (t == DataType::f16 || t == DataType::bf16);
}

// The reduction to use for a partial step of a multi-stage reduction on `t`: avg sums until the
// final division (or averages the node's ranks first: averages_by_stage); premul_sum scales only
// where the inputs enter (first stage), later stages sum.
inline Reduction partial(Reduction r, bool first_stage, DataType t) {
  if (r.op == ReduceOp::avg) return averages_by_stage(r, t) && first_stage ? r : Reduction(ReduceOp::sum);
  if (r.op == ReduceOp::premul_sum && !first_stage) return ReduceOp::sum;
  return r;
}

}  // namespace smddp::algorithms
