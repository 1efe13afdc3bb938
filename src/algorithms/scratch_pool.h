// Scratch buffers the communicator keeps from one collective to the next, so the algorithms
// across nodes neither fault in fresh pages nor register fresh memory on every call: each slot
// is one page-aligned buffer that grows to the largest size asked of it, and is handed to the
// network (Endpoint::register_region) whenever it is (re)allocated. Buffers above `keep` bytes
// are given back after the collective (trim), so a one-off huge message does not pin memory.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <vector>

#include "algorithms/algorithm.h"

namespace smddp::algorithms {

class ScratchPool {
 public:
  using Hook = std::function<void(const void*, size_t)>;
  // on_alloc(buf, bytes) runs after a buffer is made, on_free(buf, 0) before it is freed.
  ScratchPool(Hook on_alloc = {}, Hook on_free = {}) : on_alloc_(std::move(on_alloc)), on_free_(std::move(on_free)) {}
  ~ScratchPool() {
    for (size_t i = 0; i < slots_.size(); ++i) release(i);
  }
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  // At least `bytes` bytes (one or more) for `slot`; valid until the next get of that slot or
  // trim(). The contents are not kept when the slot grows.
  std::byte* get(size_t slot, size_t bytes) {
    if (slot >= slots_.size()) slots_.resize(slot + 1);
    Slot& s = slots_[slot];
    if (bytes > s.bytes || !s.buf) {
      release(slot);
      const size_t size = round_up(std::max<size_t>(bytes, 1));
      s.buf.reset(static_cast<std::byte*>(std::aligned_alloc(kPage, size)));
      if (!s.buf) throw std::bad_alloc();
      s.bytes = size;
      if (on_alloc_) {
        try {
          on_alloc_(s.buf.get(), s.bytes);
        } catch (...) {  // not made: freed without on_free, which would undo what never happened
          s.buf.reset();
          s.bytes = 0;
          throw;
        }
      }
    }
    return s.buf.get();
  }
  // Whether get(slot, bytes) would hand back the slot's current buffer (not free it and grow).
  bool fits(size_t slot, size_t bytes) const {
    return slot < slots_.size() && slots_[slot].buf && bytes <= slots_[slot].bytes;
  }
  // Frees every buffer above `keep` bytes.
  void trim(size_t keep) {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].bytes > keep) release(i);
  }

 private:
  static constexpr size_t kPage = 4096;
  static size_t round_up(size_t n) { return (n + kPage - 1) / kPage * kPage; }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  struct Slot {
    std::unique_ptr<std::byte, Free> buf;
    size_t bytes = 0;
  };
  void release(size_t slot) {
    Slot& s = slots_[slot];
    if (s.buf && on_free_) on_free_(s.buf.get(), 0);
    s.buf.reset();
    s.bytes = 0;
  }
  Hook on_alloc_, on_free_;
  std::vector<Slot> slots_;
};

// A collective's scratch from ctx.scratch. Growing a slot frees its old buffer, which device work
// still queued (an earlier slice's reduction reading received partials) may read: the device is
// fenced first. Within a size the buffer stays, and NetExchange fences before a receive reuses it.
inline std::byte* scratch_buffer(Context& ctx, size_t slot, size_t bytes) {
  if (!ctx.scratch->fits(slot, bytes)) ctx.dev.fence();
  return ctx.scratch->get(slot, bytes);
}

}  // namespace smddp::algorithms
