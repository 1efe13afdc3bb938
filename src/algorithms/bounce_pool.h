// Host buffers for the network messages of device memory the network cannot reach (CUDA without
// FI_HMEM, with SMDDP_CUDA_NET_BOUNCE): NetExchange copies a send's bytes from the device into
// one and posts that, and receives into one and copies it to the device once it has arrived. So
// a collective on such memory runs on its device (its copies and reductions on the GPU), and only the bytes that cross nodes pass through the host. Each buffer is one slot of a
// ScratchPool (page-locked for the device's copies and registered with the network when made,
// kept between collectives); a lease holds its slot while its message is in flight, so messages
// in flight together (to several peers, a pipelined algorithm's slices) each have their own.
// One thread (the collective's) uses a pool.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "algorithms/scratch_pool.h"

namespace smddp::algorithms {

class BouncePool {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), slot_(o.slot_), buf_(o.buf_) {}
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        give_back();
        pool_ = std::exchange(o.pool_, nullptr);
        slot_ = o.slot_;
        buf_ = o.buf_;
      }
      return *this;
    }
    ~Lease() { give_back(); }
    std::byte* data() const { return buf_; }

   private:
    friend class BouncePool;
    Lease(BouncePool* pool, size_t slot, std::byte* buf) : pool_(pool), slot_(slot), buf_(buf) {}
    void give_back() {
      if (pool_) pool_->busy_[slot_] = 0;
      pool_ = nullptr;
    }
    BouncePool* pool_ = nullptr;
    size_t slot_ = 0;
    std::byte* buf_ = nullptr;
  };

  BouncePool(ScratchPool::Hook on_alloc = {}, ScratchPool::Hook on_free = {})
      : slots_(std::move(on_alloc), std::move(on_free)) {}

  // A buffer of at least `bytes` bytes, this lease's alone until it is destroyed: a free slot
  // that fits, else the first free slot (grown), else a new one.
  Lease lease(size_t bytes) {
    size_t pick = busy_.size();
    for (size_t i = 0; i < busy_.size() && pick == busy_.size(); ++i)
      if (!busy_[i] && slots_.fits(i, bytes)) pick = i;
    for (size_t i = 0; i < busy_.size() && pick == busy_.size(); ++i)
      if (!busy_[i]) pick = i;
    if (pick == busy_.size()) busy_.push_back(0);
    std::byte* buf = slots_.get(pick, bytes);  // may throw: the slot stays free
    busy_[pick] = 1;
    return Lease(this, pick, buf);
  }
  size_t leased() const {
    size_t n = 0;
    for (char b : busy_) n += b != 0;
    return n;
  }
  // Frees the buffers above `keep` bytes; between collectives, when no lease is out.
  void trim(size_t keep) {
    if (leased() == 0) slots_.trim(keep);
  }

 private:
  ScratchPool slots_;
  std::vector<char> busy_;  // per slot: leased
};

}  // namespace smddp::algorithms
