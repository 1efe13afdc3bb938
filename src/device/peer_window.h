// Peer windows: reading the memory of another rank of this node directly, with one copy and no
// staging. An algorithm exposes its buffers (a small descriptor it publishes in a shared-memory
// round), opens its peers' descriptors, and reads ranges of their buffers. Each kind of memory
// has its own way in, behind this one interface, so a single algorithm serves all of them:
//   host memory    cross-memory attach (process_vm_readv): the descriptor is the address, every
//                  read is a system call that copies once (cma_window.cc)
//   device memory  an IPC handle opened once per peer allocation and cached, read by copy
//                  engines or in place by kernels (docs/gpu.md)
// A window that maps a peer's memory into this process gives its address (PeerBuffer::mapped),
// so a reduction reads it in place; one that cannot (CMA) copies through the caller's scratch.
// Reading is only safe while the peer keeps the buffer: algorithms end with a round that no rank
// leaves before every rank has finished reading.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "engine/op_info.h"
#include "smddp/errors.h"

namespace smddp::device {

// What PeerWindows::open throws where this process cannot reach the peer's memory at all (CUDA
// IPC between GPUs without peer access, or where the OS refuses IPC): on the first collective of
// a placement the ranks then stage (window_rounds.cc). Any other failure stays an error.
class PeerUnreachable : public SystemError {
 public:
  using SystemError::SystemError;
};

// One exposed buffer of a peer, as this rank reaches it.
struct PeerBuffer {
  int peer = -1;                      // the peer's local rank
  uint64_t remote = 0;                // the buffer's address in the peer's process
  size_t bytes = 0;                   // its exposed length: reads past it are refused
  const std::byte* mapped = nullptr;  // non-null: readable in place here (by this rank's Device)
};

// Refuses a read of [offset, offset + bytes) past what the peer exposed: ranks that disagree on
// sizes (SMDDP_CHECK_CONSISTENCY=0) would otherwise read another buffer's bytes, or fault.
inline void check_within(const PeerBuffer& b, size_t offset, size_t bytes, const OpInfo& op) {
  if (offset <= b.bytes && bytes <= b.bytes - offset) return;
  throw InvalidArgument("smddp: " + op.describe() + ": read of " + std::to_string(bytes) + " bytes at offset " +
                        std::to_string(offset) + " past the " + std::to_string(b.bytes) + " bytes local rank " +
                        std::to_string(b.peer) + " exposed");
}

class PeerWindows {
 public:
  // What a peer needs to open one exposed buffer (an IPC handle is 64 bytes; room for more).
  static constexpr size_t kDescriptorBytes = 96;

  virtual ~PeerWindows() = default;
  virtual const char* name() const = 0;
  // Fills `desc` (kDescriptorBytes) so that peers can open [p, p + bytes). False: this memory
  // cannot be exposed this way (then the algorithm stages instead; every rank must learn it).
  virtual bool expose(const void* p, size_t bytes, std::byte* desc) = 0;
  // Opens what local rank `peer` exposed.
  virtual PeerBuffer open(int peer, const std::byte* desc) = 0;
  // Whether this rank can in fact read what `peer` exposed in `desc` (one of its descriptors,
  // already open()ed: a failed open() counts as unreachable too); false with the reason in `why`.
  // CMA may be refused (a container's seccomp, Yama), and a peer in another PID namespace has
  // another process's pid; CUDA IPC fails to open between GPUs without peer access.
  virtual bool reachable(int /*peer*/, const std::byte* /*desc*/, std::string* /*why*/) { return true; }
  // Whether reachable() or open() can say no, so that the ranks must agree on it: once for each
  // placement of the node's buffers (algorithms/window_rounds.cc), in one extra round.
  virtual bool needs_probe() const { return false; }
  // Where the memory `desc` names lives, as far as reaching it goes: buffers of equal placements
  // on every rank are reached alike. Every rank sees every rank's descriptors, so all compute the
  // same key from them and agree whether to probe. "" (host memory): one verdict per communicator.
  // CUDA IPC: the exporting process and its GPU, since a rank's first collective on a GPU need
  // not be its peers' (a rank may use several GPUs).
  virtual std::string placement(const std::byte* /*desc*/) const { return ""; }
  // Copies [offset, offset + bytes) of a peer's buffer into `dst`, memory of this window's kind,
  // in order with the Device's work on that memory (host: both synchronous; CUDA: the same
  // stream), so a reduction queued after a read sees its data and a later read may reuse the
  // scratch only after that reduction. Throws SystemError naming the op and peer on failure.
  virtual void read(const PeerBuffer& b, size_t offset, void* dst, size_t bytes, const OpInfo& op) = 0;
  // Whether write() works: a rank may then do a node-mate's round for it, output included
  // (allreduce_rs_ag.cc). CMA writes as it reads; a CUDA IPC window only reads.
  virtual bool writable() const { return false; }
  // Copies `bytes` of this rank's host memory at `src` into [offset, offset + bytes) of a peer's
  // buffer, synchronously. Throws SystemError naming the op and peer on failure.
  virtual void write(const PeerBuffer& b, size_t /*offset*/, const void* /*src*/, size_t /*bytes*/,
                     const OpInfo& op) {
    throw InvalidArgument("smddp: " + op.describe() + ": a " + name() + " window cannot write local rank " +
                          std::to_string(b.peer) + "'s memory");
  }

  // Set, alike on every rank, by the first single-copy collective of each placement key (the
  // placements of every rank's buffers, joined): whether every rank reached every peer. False:
  // the single-copy algorithms stage from then on for that key.
  std::map<std::string, bool> reachable_by_placement;
  // The verdict for host memory (placement ""), for tests: unset before the first probe.
  std::optional<bool> reachable_everywhere() const {
    auto it = reachable_by_placement.find("");
    if (it == reachable_by_placement.end()) return std::nullopt;
    return it->second;
  }
};

// Host memory of the node's other ranks by process_vm_readv; `pid_of(r)` is local rank r's
// process. Needs ptrace permission between the ranks (the same user; shm::Group sets
// PR_SET_PTRACER for Yama).
std::unique_ptr<PeerWindows> cma_windows(std::function<int(int)> pid_of);

}  // namespace smddp::device
