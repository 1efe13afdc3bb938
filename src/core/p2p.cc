#include "core/p2p.h"

#include <string>

#include "smddp/errors.h"

namespace smddp::p2p {

void check_header(const Header& h, uint32_t tag, size_t bytes, int peer, const OpInfo& op) {
  if (h.magic != kMagic)
    throw SystemError("smddp: " + op.describe() + ": corrupt message header from rank " + std::to_string(peer));
  if (h.tag != tag || h.bytes != bytes)
    throw InvalidArgument("smddp: " + op.describe() + ": expected a message of " + std::to_string(bytes) +
                          " bytes with tag " + std::to_string(tag) + " from rank " + std::to_string(peer) +
                          ", but the next one has " + std::to_string(h.bytes) + " bytes with tag " +
                          std::to_string(h.tag) + " (messages between two ranks are matched in order)");
}

Send::Send(const void* data, size_t bytes, int peer, uint32_t tag)
    : hdr_{kMagic, tag, bytes}, data_(static_cast<const std::byte*>(data)), peer_(peer) {}

// Every poll looks for an abort before any byte moves: after an abort the stream between a pair
// may be cut mid-message (a failed receive also keeps its claim on the FIFO), so no later
// message is taken.
bool Send::poll(shm::Group& g, const OpInfo& op) {
  g.throw_if_aborted(op);
  if (!g.claim_fifo(true, peer_, this)) {  // an earlier send to this peer is still moving
    g.check_progress(peer_, op, "receive");
    return false;
  }
  if (hdr_done_ < sizeof hdr_)
    hdr_done_ += g.fifo_push(peer_, reinterpret_cast<const std::byte*>(&hdr_) + hdr_done_, sizeof hdr_ - hdr_done_);
  if (hdr_done_ == sizeof hdr_ && body_done_ < hdr_.bytes)
    body_done_ += g.fifo_push(peer_, data_ + body_done_, hdr_.bytes - body_done_);
  if (hdr_done_ == sizeof hdr_ && body_done_ == hdr_.bytes) {
    g.release_fifo(true, peer_, this);
    return true;
  }
  g.check_progress(peer_, op, "receive");
  return false;
}

Recv::Recv(void* data, size_t bytes, int peer, uint32_t tag)
    : data_(static_cast<std::byte*>(data)), bytes_(bytes), peer_(peer), tag_(tag) {}

void Recv::check_sender(shm::Group& g, const OpInfo& op) const {
  try {
    g.check_progress(peer_, op, "send");
  } catch (const PeerError&) {
    // A peer may push its last messages and exit between a read and this check: what it pushed
    // stays readable, so the receives take it before the loss is reported.
    if (g.fifo_available(peer_) > 0) return;
    throw;
  }
}

// Whether the unresolved receive from any rank posted before this one may take `peer`'s next
// message: unless that message is here, unclaimed, and opens under another tag, it may.
static bool any_may_take(shm::Group& g, int peer) {
  Header h{};
  if (g.fifo_claimed(false, peer) || g.fifo_available(peer) < sizeof h) return true;
  g.fifo_peek(peer, &h, sizeof h);
  return opens_message(h, g.open_any_tag());
}

bool Recv::poll(shm::Group& g, const OpInfo& op) {
  g.throw_if_aborted(op);
  if (!claimed_) {
    // An earlier receive from this peer, or from any rank that may take this peer's next
    // message, comes first. One that cannot (its tag is another's) does not hold this one up,
    // as it does not in MPI or gloo.
    if ((g.any_open_before(op.seq) && any_may_take(g, peer_)) || !g.claim_fifo(false, peer_, this)) {
      check_sender(g, op);
      return false;
    }
    claimed_ = true;
  }
  if (hdr_done_ < sizeof hdr_) {
    hdr_done_ += g.fifo_pop(peer_, reinterpret_cast<std::byte*>(&hdr_) + hdr_done_, sizeof hdr_ - hdr_done_);
    if (hdr_done_ == sizeof hdr_) check_header(hdr_, tag_, bytes_, peer_, op);
  }
  if (hdr_done_ == sizeof hdr_ && body_done_ < bytes_)
    body_done_ += g.fifo_pop(peer_, data_ + body_done_, bytes_ - body_done_);
  if (hdr_done_ == sizeof hdr_ && body_done_ == bytes_) {
    g.release_fifo(false, peer_, this);
    return true;
  }
  check_sender(g, op);
  return false;
}

int peek_any(shm::Group& g, uint32_t tag, int* next) {
  int found = -1;
  for (int k = 0; k < g.size() && found < 0; ++k) {
    const int src = (*next + k) % g.size();
    Header h{};
    // A FIFO an earlier receive holds may be mid-message: its head is not a header, and its
    // next message is that receive's anyway.
    if (g.fifo_claimed(false, src) || g.fifo_available(src) < sizeof h) continue;
    g.fifo_peek(src, &h, sizeof h);
    if (opens_message(h, tag)) found = src;
  }
  *next = (*next + 1) % g.size();
  return found;
}

void RecvAny::check_senders(shm::Group& g, const OpInfo& op) {
  g.check_progress(-1, op, "send");
  switch (g.check_any_sender(op, [&](int r) { return left_a_message_under(g, r, tag_); })) {
    case shm::Group::Senders::not_looked:
      return;
    case shm::Group::Senders::some_may_send:
      looks_with_none_left_ = 0;
      return;
    case shm::Group::Senders::none_left:
      // Twice, 20 ms apart: a send to itself submitted after this receive may not have been
      // polled yet at the first look, and is under way or in its FIFO by the second.
      if (++looks_with_none_left_ < 2) return;
      std::string ranks;
      int first = -1;
      for (int r = 0; r < g.size(); ++r)
        if (r != g.rank()) {
          if (first < 0) first = g.global(r);
          ranks += (ranks.empty() ? "" : ", ") + std::to_string(g.global(r));
        }
      throw PeerError("smddp: " + op.describe() + ": every rank that could send to it (rank" +
                          (g.size() > 2 ? "s " : " ") + ranks + ") left (destroyed its communicator) or died " +
                          "with no message under tag " + std::to_string(tag_) + " for it",
                      first);
  }
}

bool left_a_message_under(shm::Group& g, int src, uint32_t tag) {
  if (g.fifo_claimed(false, src)) return true;
  const size_t available = g.fifo_available(src);
  for (size_t at = 0; at + sizeof(Header) <= available;) {
    Header h{};
    g.fifo_peek(src, &h, sizeof h, at);
    if (h.magic != kMagic) return false;  // not a message boundary: nothing to read there
    if (h.tag == tag) return true;
    if (h.bytes > available) return false;  // its body is not all there: nothing after it is
    at += sizeof h + h.bytes;
  }
  return false;  // (a header cut short by its sender's death never becomes a message)
}

bool RecvAny::poll(shm::Group& g, const OpInfo& op) {
  g.throw_if_aborted(op);
  if (!chosen_) {
    if (g.any_open_before(op.seq)) {  // an earlier receive from any rank takes the next message
      check_senders(g, op);
      return false;
    }
    if (!open_in_) {
      g.open_any(op.seq, tag_);
      open_in_ = &g;
      seq_ = op.seq;
    }
    const int src = peek_any(g, tag_, &next_);
    if (src < 0) {
      check_senders(g, op);
      return false;
    }
    g.close_any(seq_);
    open_in_ = nullptr;
    chosen_ = std::make_unique<Recv>(data_, bytes_, src, tag_);
    source_->store(src);
  }
  return chosen_->poll(g, op);
}

}  // namespace smddp::p2p
