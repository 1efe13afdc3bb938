// Point-to-point operations with a rank on another node, as the engine polls them (p2p.h has
// those inside a node): a send or receive over libfabric, and a receive from any rank that takes
// a message from the network or from this node's FIFOs. Messages between a pair are numbered
// (PairOrder), so the k-th receive takes the k-th message, as inside a node. Used by
// CommunicatorImpl's send, recv and recv_any only.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/p2p.h"
#include "core/pair_order.h"
#include "engine/op_info.h"
#include "smddp/errors.h"
#include "transport/ofi/endpoint.h"
#include "transport/shm/shm_group.h"

namespace smddp::detail {

// What a point-to-point operation across nodes does while it waits: looks for an abort here or
// elsewhere every 20 ms, and times out at its deadline (naming the peer once its transfer is posted).
class NetWait {
 public:
  explicit NetWait(std::function<void(const OpInfo&)> watch) : watch_(std::move(watch)) {}
  bool still_waiting(ofi::Endpoint& ep, const ofi::Endpoint::Handle& h, const OpInfo& op) {
    auto now = Clock::now();
    if (now >= next_watch_) {
      watch_(op);
      next_watch_ = now + std::chrono::milliseconds(20);
    }
    if (h) ep.throw_if_late(h, op);
    else if (now >= op.deadline)
      throw TimeoutError("smddp: " + op.describe() + ": timeout after " + std::to_string(op.timeout.count()) +
                             " ms: an earlier receive from any rank never got its message",
                         {});
    return false;
  }

 private:
  std::function<void(const OpInfo&)> watch_;
  Clock::time_point next_watch_{};
};

// Cancels the posted request `h` (if any) and waits for the network to let go of its buffer;
// never throws (the caller has an error of its own on its way, or none to give).
inline void cancel_quietly(ofi::Endpoint& ep, const ofi::Endpoint::Handle& h) noexcept {
  if (!h) return;
  try {
    ep.cancel(h);
  } catch (...) {
  }
}

// Runs one poll of a transfer whose request is `h` (null until posted). If it throws, the
// request's posted operations are cancelled before the error reaches the caller, who may then
// free the buffer (as NetExchange does for collectives).
template <class Step>
bool cancelled_on_failure(ofi::Endpoint& ep, const ofi::Endpoint::Handle& h, Step step) {
  try {
    return step();
  } catch (...) {
    cancel_quietly(ep, h);
    throw;
  }
}

// Whether a transfer machine is finished with the network: it completed, failed (its request
// cancelled on the way out) or gave its receive up. One destroyed before that (the engine failed
// it unpolled: its communicator was destroyed under it, or aborted) cancels its request itself:
// the caller may free the buffer as soon as the operation has failed, while the endpoint, which
// goes later with the communicator, would otherwise still place a message there (and efa's NIC
// writes a posted buffer without any poll of ours).
class Settled {
 public:
  template <class Step>
  bool track(ofi::Endpoint& ep, const ofi::Endpoint::Handle& h, Step step) {
    bool done = false;
    try {
      done = cancelled_on_failure(ep, h, step);
    } catch (...) {
      settled_ = true;
      throw;
    }
    if (done) settled_ = true;
    return done;
  }
  void set() { settled_ = true; }
  bool operator()() const { return settled_; }

 private:
  bool settled_ = false;
};

// A point-to-point message to or from another node: one tagged libfabric transfer, numbered
// among the pair's messages when first polled (pair_order.h).
class NetTransfer {
 public:
  NetTransfer(ofi::Endpoint& ep, PairOrder& order, bool is_send, void* buf, size_t bytes, int peer, uint32_t tag,
              std::function<void(const OpInfo&)> watch)
      : ep_(ep), order_(order), is_send_(is_send), buf_(buf), bytes_(bytes), peer_(peer), tag_(tag),
        wait_(std::move(watch)) {}
  ~NetTransfer() {
    if (!settled_()) cancel_quietly(ep_, h_);
  }
  NetTransfer(const NetTransfer&) = delete;
  NetTransfer& operator=(const NetTransfer&) = delete;
  bool poll(shm::Group& g, const OpInfo& op) {
    return settled_.track(ep_, h_, [&] { return step(g, op); });
  }

 private:
  bool step(shm::Group& g, const OpInfo& op) {
    g.throw_if_aborted(op);  // this node aborted: the posted transfer is cancelled on the way out
    if (!h_) {
      if (is_send_) {
        h_ = ep_.send_p2p(peer_, buf_, bytes_, tag_, order_.next_send(peer_));
      } else if (auto n = order_.next_recv(peer_)) {
        h_ = ep_.recv_p2p(peer_, buf_, bytes_, tag_, *n);
      } else {
        return wait_.still_waiting(ep_, h_, op);  // behind a receive from any rank
      }
    }
    if (ep_.test(h_)) return true;
    return wait_.still_waiting(ep_, h_, op);
  }

  ofi::Endpoint& ep_;
  PairOrder& order_;
  bool is_send_;
  void* buf_;
  size_t bytes_;
  int peer_;
  uint32_t tag_;
  NetWait wait_;
  ofi::Endpoint::Handle h_;
  Settled settled_;
};

// A receive from any source when the ranks span nodes: one receive posted on the network for
// any sender, while this node's FIFOs are peeked. A local message found first withdraws the
// network receive; if a network message landed meanwhile, that one is the message (the local
// one stays in its FIFO for the next receive), so exactly one message is taken either way.
class NetOrLocalAnySource {
 public:
  NetOrLocalAnySource(ofi::Endpoint& ep, PairOrder& order, void* buf, size_t bytes, uint32_t tag,
                      std::vector<int> local_ranks, std::shared_ptr<std::atomic<int>> source,
                      std::function<void(const OpInfo&)> watch)
      : ep_(ep), order_(order), buf_(buf), bytes_(bytes), tag_(tag), local_ranks_(std::move(local_ranks)),
        source_(std::move(source)), wait_(std::move(watch)) {}
  ~NetOrLocalAnySource() {
    if (!settled_()) cancel_quietly(ep_, h_);  // (before its place among receives from any rank goes)
    resolved();
  }
  NetOrLocalAnySource(const NetOrLocalAnySource&) = delete;
  NetOrLocalAnySource& operator=(const NetOrLocalAnySource&) = delete;
  bool poll(shm::Group& g, const OpInfo& op) {
    // (a network receive withdrawn for a local message: cancelling it again is harmless)
    return settled_.track(ep_, h_, [&] { return step(g, op); });
  }

 private:
  bool step(shm::Group& g, const OpInfo& op) {
    g.throw_if_aborted(op);  // this node aborted: the posted receive is cancelled on the way out
    if (local_) return local_->poll(g, op);
    if (!h_) {
      if (!order_.open_any()) return wait_.still_waiting(ep_, h_, op);  // behind another receive from any rank
      // The receives from this node's ranks issued after this one wait too (Group::open_any).
      g.open_any(op.seq, tag_);
      open_in_ = &g;
      seq_ = op.seq;
      h_ = ep_.recv_any(buf_, bytes_, tag_);
    }
    if (ep_.test(h_)) return took_network_message();
    const int src = p2p::peek_any(g, tag_, &next_);
    if (src >= 0) {
      if (ep_.withdraw(h_)) return took_network_message();
      settled_.set();  // the network receive is withdrawn: nothing lands in the buffer from there
      order_.close_any();
      resolved();
      local_ = std::make_unique<p2p::Recv>(buf_, bytes_, src, tag_);
      source_->store(local_ranks_[static_cast<size_t>(src)]);
      return local_->poll(g, op);
    }
    // A node-mate that died fails it; ranks elsewhere may still send.
    g.check_any_sender(op, [&](int r) { return p2p::left_a_message_under(g, r, tag_); });
    return wait_.still_waiting(ep_, h_, op);
  }

  bool took_network_message() {
    const int from = ep_.source(h_);
    order_.close_any(from, ep_.order(h_));
    resolved();
    source_->store(from);
    return true;
  }
  ofi::Endpoint& ep_;
  PairOrder& order_;
  void* buf_;
  size_t bytes_;
  uint32_t tag_;
  std::vector<int> local_ranks_;
  std::shared_ptr<std::atomic<int>> source_;
  NetWait wait_;
  ofi::Endpoint::Handle h_;
  Settled settled_;
  void resolved() {
    if (open_in_) open_in_->close_any(seq_);
    open_in_ = nullptr;
  }
  std::unique_ptr<p2p::Recv> local_;
  int next_ = 0;
  shm::Group* open_in_ = nullptr;  // while unresolved (Group::open_any)
  uint64_t seq_ = 0;
};

}  // namespace smddp::detail
