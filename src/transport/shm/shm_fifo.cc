// shm::Group's point-to-point FIFOs: one single-producer single-consumer ring per ordered pair
// of ranks (fifo_ring.h does the index maths), and the check whether any rank may still send.
#include <string>

#include "device/host_copy.h"
#include "smddp/errors.h"
#include "transport/shm/fifo_ring.h"
#include "transport/shm/shm_group_layout.h"

namespace smddp::shm {

using namespace layout;

size_t Group::fifo_push(int dst, const void* data, size_t bytes) {
  if (!ring_reserved_[static_cast<size_t>(dst)]) {
    try {
      seg_.reserve(static_cast<size_t>(fifo_data(rank_, dst) - static_cast<std::byte*>(seg_.data())), cfg_.fifo_bytes);
    } catch (const NoRoomError& e) {
      throw SystemError(std::string(e.what()) + ": the point-to-point FIFO from rank " + std::to_string(global(rank_)) +
                        " to rank " + std::to_string(global(dst)) + " (" + std::to_string(cfg_.fifo_bytes) +
                        " bytes, SMDDP_SHM_FIFO)" + other_groups_note(1) + "; " + kMoreRoom + " or lower SMDDP_SHM_FIFO");
    }
    ring_reserved_[static_cast<size_t>(dst)] = 1;
  }
  FifoCtl* f = fifo(rank_, dst);
  const uint64_t head = f->head.load(std::memory_order_relaxed);
  const uint64_t tail = f->tail.load(std::memory_order_acquire);  // the peer's: fifo_ring.h
  const RingSpan s = push_span(head, tail, cfg_.fifo_bytes, bytes);
  if (s.bytes() == 0) return 0;
  std::byte* ring = fifo_data(rank_, dst);
  device::host_copy(ring + s.pos, data, s.first);
  device::host_copy(ring, static_cast<const std::byte*>(data) + s.first, s.second);
  f->head.store(head + s.bytes(), std::memory_order_release);
  ring_fifo_bell(dst, /*always=*/false);  // the receiver, if it sleeps
  return s.bytes();
}

bool Group::claim_fifo(bool outgoing, int peer, const void* who) {
  const void*& owner = fifo_owner_[static_cast<size_t>(outgoing) * size_ + peer];
  if (!owner) owner = who;
  return owner == who;
}

void Group::release_fifo(bool outgoing, int peer, const void* who) {
  const void*& owner = fifo_owner_[static_cast<size_t>(outgoing) * size_ + peer];
  if (owner == who) owner = nullptr;
}

bool Group::fifo_claimed(bool outgoing, int peer) const {
  return fifo_owner_[static_cast<size_t>(outgoing) * size_ + peer] != nullptr;
}

size_t Group::fifo_available(int src) const {
  const FifoCtl* f = fifo(src, rank_);
  return ring_filled(f->head.load(std::memory_order_acquire), f->tail.load(std::memory_order_relaxed),
                     cfg_.fifo_bytes);
}

void Group::fifo_peek(int src, void* data, size_t bytes, size_t offset) const {
  const FifoCtl* f = fifo(src, rank_);
  const RingSpan s = ring_span(f->tail.load(std::memory_order_relaxed) + offset, bytes, cfg_.fifo_bytes);
  const std::byte* ring = fifo_data(src, rank_);
  device::host_copy(data, ring + s.pos, s.first);
  device::host_copy(static_cast<std::byte*>(data) + s.first, ring, s.second);
}

size_t Group::fifo_pop(int src, void* data, size_t bytes) {
  FifoCtl* f = fifo(src, rank_);
  const uint64_t tail = f->tail.load(std::memory_order_relaxed);
  const uint64_t head = f->head.load(std::memory_order_acquire);  // the peer's: fifo_ring.h
  const RingSpan s = pop_span(head, tail, cfg_.fifo_bytes, bytes);
  if (s.bytes() == 0) return 0;
  const std::byte* ring = fifo_data(src, rank_);
  device::host_copy(data, ring + s.pos, s.first);
  device::host_copy(static_cast<std::byte*>(data) + s.first, ring, s.second);
  f->tail.store(tail + s.bytes(), std::memory_order_release);
  ring_fifo_bell(src, /*always=*/false);  // the sender, if it sleeps waiting for room
  return s.bytes();
}

Group::Senders Group::check_any_sender(const OpInfo& op, const std::function<bool(int)>& left_one) {
  const auto now = Clock::now();
  if (now < next_sender_check_) return Senders::not_looked;
  next_sender_check_ = now + std::chrono::milliseconds(20);
  // A send to itself under way; alone in the communicator, a send to itself still to come.
  bool any_may_send = size_ == 1 || fifo_claimed(true, rank_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const RankCtl* c = ctl(r);
    if (!c->departed.load(std::memory_order_acquire)) {
      const int pid = c->pid.load(std::memory_order_acquire);
      const bool died = pid > 0 && c->pidns == pidns_ && process_dead(pid) &&
                        !c->departed.load(std::memory_order_acquire);  // (one that left, then exited, is not dead)
      if (!died) {
        any_may_send = true;
        continue;
      }
      // Its FIFO is read after its death was seen: a message it pushed just before is there.
      if (!left_one(r)) {
        throw_if_aborted(op);  // a reason it wrote before it died names the cause better
        throw PeerError("smddp: " + op.describe() + ": rank " + std::to_string(global(r)) + " died (pid " +
                            std::to_string(pid) + ") while this rank waited for any rank to send",
                        global(r));
      }
      any_may_send = true;
      continue;
    }
    any_may_send |= left_one(r);
  }
  return any_may_send ? Senders::some_may_send : Senders::none_left;
}

}  // namespace smddp::shm
