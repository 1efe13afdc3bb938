// Point-to-point on CUDA memory: the shared-memory FIFOs and the network move host memory (as
// host_staging.h does for collectives across nodes), so a send first copies its buffer into a
// page-locked host buffer and a receive copies the message into its buffer once it has landed.
// The copies are the Device's (its copy engines, ordered after the caller's stream), run by the
// thread polling point-to-point ops (engine.h) when it first polls a send and when a receive's
// message is complete, so the caller's thread never blocks on them. On a failure nothing is copied into the receive's buffer.
// Nothing here knows CUDA.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "algorithms/scratch_pool.h"
#include "device/device.h"
#include "engine/op_info.h"

namespace smddp::shm {
class Group;
}

namespace smddp::detail {

// A point-to-point operation as the engine polls it: makes some progress, true when finished.
using P2pPoll = std::function<bool(shm::Group&, const OpInfo&)>;
template <class Machine>
P2pPoll polled(std::shared_ptr<Machine> m) {
  return [m = std::move(m)](shm::Group& g, const OpInfo& op) { return m->poll(g, op); };
}

// Host buffers for the device point-to-point operations in flight, one each for its life (a
// batch of sends and receives progresses together): kept between operations, so page-locking
// (the pool's hooks) is paid once per size, not per message. Thread-safe.
class P2pStagingPool {
 public:
  P2pStagingPool(algorithms::ScratchPool::Hook on_alloc, algorithms::ScratchPool::Hook on_free, size_t keep)
      : pool_(std::move(on_alloc), std::move(on_free)), keep_(keep) {}

  class Lease {
   public:
    Lease(P2pStagingPool* pool, size_t slot, std::byte* data) : pool_(pool), slot_(slot), data_(data) {}
    Lease(Lease&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), slot_(o.slot_), data_(o.data_) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_) pool_->give_back(slot_);
    }
    std::byte* data() const { return data_; }
    // For an operation that failed after it was started: the network may still hold the buffer
    // (a receive posted and never withdrawn), so it is neither reused nor freed until the pool
    // goes, with the communicator, which an operation's failure has aborted anyway.
    void abandon() {
      if (pool_) pool_->set_aside();
      pool_ = nullptr;
    }

   private:
    P2pStagingPool* pool_;
    size_t slot_;
    std::byte* data_;
  };

  Lease take(size_t bytes);
  // How many buffers are out now (tests).
  size_t leased() const;

 private:
  void give_back(size_t slot);
  void set_aside();

  mutable std::mutex mu_;
  algorithms::ScratchPool pool_;  // guarded by mu_
  std::vector<size_t> free_;      // slots not leased
  size_t slots_ = 0, out_ = 0;  // out_: leased and not abandoned
  size_t abandoned_ = 0;        // while any is, nothing is trimmed
  size_t keep_;                 // buffers above this are freed when none is out
};

// One point-to-point operation on device memory around `host_poll`, the same operation on
// `host` (a send's bytes, a receive's landing place), as the engine polls it. `device` is
// called on the polling thread, at the first poll: the Device of the buffer's GPU. `ready`
// (may be null) is the caller's stream's event at the call, which the first device copy waits
// for: a send reads its buffer only after the work queued before it, a receive writes its
// buffer only after that work (which may still read the old contents).
class StagedP2p {
 public:
  StagedP2p(bool is_send, void* buffer, size_t bytes, P2pStagingPool::Lease host,
            std::function<device::Device&()> device, std::shared_ptr<void> ready, P2pPoll host_poll);
  // An operation polled but not finished (it failed, or the communicator was destroyed under it)
  // abandons its host buffer (Lease::abandon).
  ~StagedP2p();
  StagedP2p(const StagedP2p&) = delete;
  StagedP2p& operator=(const StagedP2p&) = delete;
  bool poll(shm::Group& g, const OpInfo& op);

 private:
  device::Device& dev();

  bool is_send_;
  void* buffer_;
  size_t bytes_;
  P2pStagingPool::Lease host_;
  std::function<device::Device&()> device_;
  device::Device* dev_ = nullptr;
  std::shared_ptr<void> ready_;
  P2pPoll host_poll_;
  bool copied_in_ = false;  // send: the buffer is in host_
  bool polled_ = false, done_ = false;
};

}  // namespace smddp::detail
