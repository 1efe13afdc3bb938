// The registration cache: memory regions registered once and reused by every transfer that lies
// inside them. It holds only regions whose lifetime smddp controls (the communicator's scratch
// buffers, registered when allocated and deregistered before they are freed): a cache of user
// buffers would need to see frees and remaps (a freed and reused address with new pages behind
// it must not keep the old registration), which is what the providers' own caches do with
// memory monitors (libfabric's FI_MR_CACHE_MONITOR, on by default for efa). Pure bookkeeping, no
// libfabric: `Handle` is whatever the registrar returns (tests/unit/region_cache_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

namespace smddp::ofi {

template <class Handle>
class RegionCache {
 public:
  // Regions must not overlap (each is its own allocation); re-adding a base replaces it and
  // returns the old handle for the caller to release.
  std::optional<Handle> add(const void* base, size_t bytes, Handle h) {
    std::optional<Handle> old = remove(base);
    regions_.emplace(addr(base), Entry{bytes, std::move(h)});
    return old;
  }
  // The handle of the region that wholly contains [p, p + bytes), or null.
  const Handle* find(const void* p, size_t bytes) const {
    auto it = regions_.upper_bound(addr(p));
    if (it == regions_.begin()) return nullptr;
    --it;
    const uintptr_t lo = it->first, hi = lo + it->second.bytes;
    return addr(p) >= lo && addr(p) + bytes <= hi ? &it->second.handle : nullptr;
  }
  // Takes the region starting at `base` out; its handle, for the caller to release.
  std::optional<Handle> remove(const void* base) {
    auto it = regions_.find(addr(base));
    if (it == regions_.end()) return std::nullopt;
    std::optional<Handle> h(std::move(it->second.handle));
    regions_.erase(it);
    return h;
  }
  size_t size() const { return regions_.size(); }

 private:
  struct Entry {
    size_t bytes;
    Handle handle;
  };
  static uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }
  std::map<uintptr_t, Entry> regions_;
};

}  // namespace smddp::ofi
