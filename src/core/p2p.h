// Point-to-point messages over the shared-memory FIFOs, as pollable state machines.
// A message is a 16-byte header (tag, byte count) followed by the payload; messages between a
// pair of ranks arrive in order, and the receiver checks that tag and size are what it expects.
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace smddp::p2p
