// The numbering of point-to-point messages to and from ranks on other nodes (ofi/wire.h: between
// two ranks, the k-th receive takes the k-th message, as inside a node, and then compares tags).
//
// Numbers are handed out when an operation is first polled: the engine polls point-to-point
// operations in the order they were issued (engine.h), which is program order. A receive from
// any rank takes whichever number its message carries, so until it has one, the receives issued
// after it wait unnumbered (else they could be numbered for the message it takes). Used only on
// the thread that polls point-to-point ops (the engine's, or a running collective's beside them;
// one at a time, handed over under the engine's lock: engine.h).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

namespace smddp::detail {

class PairOrder {
 public:
  explicit PairOrder(int size) : sent_(static_cast<size_t>(size)), received_(static_cast<size_t>(size)),
                                 taken_(static_cast<size_t>(size)) {}

  uint32_t next_send(int peer) { return sent_[static_cast<size_t>(peer)]++; }

  // The number of the next receive from `peer`; none while a receive from any rank is unresolved.
  std::optional<uint32_t> next_recv(int peer) {
    if (any_open_) return std::nullopt;
    auto& n = received_[static_cast<size_t>(peer)];
    auto& taken = taken_[static_cast<size_t>(peer)];
    while (taken.erase(n & kMask)) ++n;  // numbers a receive from any rank took out of turn
    return n++;
  }

  // A receive from any rank may be posted (one at a time); it then holds the others back.
  bool open_any() {
    if (any_open_) return false;
    any_open_ = true;
    return true;
  }
  // It took message `order` from `peer` over the network.
  void close_any(int peer, uint32_t order) {
    auto& n = received_[static_cast<size_t>(peer)];
    if ((n & kMask) == (order & kMask)) ++n;
    else taken_[static_cast<size_t>(peer)].insert(order & kMask);
    any_open_ = false;
  }
  // It took a message inside the node, or none.
  void close_any() { any_open_ = false; }

 private:
  static constexpr uint32_t kMask = 0x7FFF;  // the number's bits on the wire
  std::vector<uint32_t> sent_, received_;
  std::vector<std::set<uint32_t>> taken_;
  bool any_open_ = false;
};

}  // namespace smddp::detail
