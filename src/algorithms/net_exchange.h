// What an algorithm sees of the network: post sends and receives to global ranks by step, then
// wait for all of them. Tags are derived from the operation's sequence number and the step, so
// messages of different collectives or steps never match each other, whatever order the fabric
// delivers them in.
#pragma once

#include <vector>

#include "algorithms/algorithm.h"
#include "transport/ofi/endpoint.h"

namespace smddp::algorithms {

class NetExchange {
 public:
  explicit NetExchange(Context& ctx) : ep_(*ctx.net), op_(ctx.op), watch_(ctx.watch) {}
  ~NetExchange() = default;

  void send(int peer, const void* buf, size_t bytes, uint32_t step) {
    pending_.push_back(ep_.send(peer, buf, bytes, tag(step)));
  }
  void recv(int peer, void* buf, size_t bytes, uint32_t step) {
    pending_.push_back(ep_.recv(peer, buf, bytes, tag(step)));
  }
  // Waits for everything posted so far (deadline: the operation's).
  void wait() {
    for (auto& h : pending_) ep_.wait(h, op_, watch_);
    pending_.clear();
  }

 private:
  // Bit 31 marks collective traffic; point-to-point tags stay below it.
  uint32_t tag(uint32_t step) const {
    return 0x80000000u | static_cast<uint32_t>((op_.coll_seq & 0x7FFFF) << 12) | (step & 0xFFF);
  }
  ofi::Endpoint& ep_;
  const OpInfo& op_;
  const std::function<void()>* watch_;
  std::vector<ofi::Endpoint::Handle> pending_;
};

// The reduction to use for a partial step of a multi-stage reduction: avg sums until the final
// division; premul_sum scales only where the inputs enter (first stage), later stages sum.
inline Reduction partial(Reduction r, bool first_stage) {
  if (r.op == ReduceOp::avg) return ReduceOp::sum;
  if (r.op == ReduceOp::premul_sum && !first_stage) return ReduceOp::sum;
  return r;
}

}  // namespace smddp::algorithms
