// Point-to-point messages over the shared-memory FIFOs, as pollable state machines.
// A message is a 16-byte header (tag, byte count) followed by the payload; messages between a
// pair of ranks arrive in order, and the receiver checks that tag and size are what it expects.
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <memory>

#include "engine/op_info.h"
#include "transport/shm/shm_group.h"

namespace smddp::p2p {

struct Header {
  uint32_t magic;
  uint32_t tag;
  uint64_t bytes;
};
static_assert(sizeof(Header) == 16);
inline constexpr uint32_t kMagic = 0x50325030;  // "P2P0"

// A header as the peer wrote it, against the receive posted for it: returns when it opens a
// message of exactly `bytes` bytes under `tag` (so the body read is bounded by the receiver's
// buffer); throws SystemError for one that is not a header, InvalidArgument for a message of
// another tag or size. `op` and `peer` name the receive in the message.
void check_header(const Header& h, uint32_t tag, size_t bytes, int peer, const OpInfo& op);
// Whether a header at the head of a FIFO opens a message under `tag` (a receive from any rank).
inline bool opens_message(const Header& h, uint32_t tag) {
  return h.magic == kMagic && h.tag == tag;
}

class Send {
 public:
  Send(const void* data, size_t bytes, int peer, uint32_t tag);
  // Pushes what fits; true once everything is in the FIFO.
  bool poll(shm::Group& g, const OpInfo& op);

 private:
  Header hdr_;
  const std::byte* data_;
  size_t hdr_done_ = 0, body_done_ = 0;
  int peer_;
};

class Recv {
 public:
  Recv(void* data, size_t bytes, int peer, uint32_t tag);
  bool poll(shm::Group& g, const OpInfo& op);

 private:
  void check_sender(shm::Group& g, const OpInfo& op) const;

  Header hdr_{};
  std::byte* data_;
  size_t bytes_;
  size_t hdr_done_ = 0, body_done_ = 0;
  int peer_;
  uint32_t tag_;
  bool claimed_ = false;  // holds the FIFO from its peer (Group::claim_fifo)
};

// The first local rank, round robin from *next (which advances), whose FIFO's next message
// carries `tag`; -1 when none does yet.
int peek_any(shm::Group& g, uint32_t tag, int* next);

// For a receive from any rank under `tag`, of a sender that is gone (shm::Group::check_any_sender):
// whether its FIFO holds a whole header under `tag` among the messages it left, or a receive of
// this rank is reading it (what follows is unknown).
bool left_a_message_under(shm::Group& g, int src, uint32_t tag);

// Receive from whichever rank's next message carries `tag` (MPI_ANY_SOURCE): peeks at the head of
// every incoming FIFO, round robin, and becomes a plain Recv from the first that matches.
class RecvAny {
 public:
  RecvAny(void* data, size_t bytes, uint32_t tag, std::shared_ptr<std::atomic<int>> source)
      : data_(data), bytes_(bytes), tag_(tag), source_(std::move(source)) {}
  ~RecvAny() {
    if (open_in_) open_in_->close_any(seq_);  // failed unresolved: the later receives go on
  }
  RecvAny(const RecvAny&) = delete;
  RecvAny& operator=(const RecvAny&) = delete;
  bool poll(shm::Group& g, const OpInfo& op);

 private:
  // Nothing found: a node-mate that died fails it, and so does every other rank of the
  // communicator (all on this node) having left with nothing for it.
  void check_senders(shm::Group& g, const OpInfo& op);
  int looks_with_none_left_ = 0;  // consecutive looks of Group::check_any_sender that said so
  shm::Group* open_in_ = nullptr;  // while unresolved and looking (Group::open_any)
  uint64_t seq_ = 0;
  void* data_;
  size_t bytes_;
  uint32_t tag_;
  std::shared_ptr<std::atomic<int>> source_;  // the local rank it came from, once known
  std::unique_ptr<Recv> chosen_;
  int next_ = 0;
};

}  // namespace smddp::p2p
