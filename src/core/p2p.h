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
  Header hdr_{};
  std::byte* data_;
  size_t bytes_;
  size_t hdr_done_ = 0, body_done_ = 0;
  int peer_;
  uint32_t tag_;
};

// The first local rank, round robin from *next (which advances), whose FIFO's next message
// carries `tag`; -1 when none does yet.
int peek_any(shm::Group& g, uint32_t tag, int* next);

// Receive from whichever rank's next message carries `tag` (MPI_ANY_SOURCE): peeks at the head of
// every incoming FIFO, round robin, and becomes a plain Recv from the first that matches.
class RecvAny {
 public:
  RecvAny(void* data, size_t bytes, uint32_t tag, std::shared_ptr<std::atomic<int>> source)
      : data_(data), bytes_(bytes), tag_(tag), source_(std::move(source)) {}
  bool poll(shm::Group& g, const OpInfo& op);

 private:
  void* data_;
  size_t bytes_;
  uint32_t tag_;
  std::shared_ptr<std::atomic<int>> source_;  // the local rank it came from, once known
  std::unique_ptr<Recv> chosen_;
  int next_ = 0;
};

}  // namespace smddp::p2p
