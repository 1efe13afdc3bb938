// RAII owners for libfabric objects (in the manner of aws-ofi-nccl): every fid_* the transport
// opens is closed exactly once, in reverse order of opening, whatever path leaves the scope.
#pragma once

#include <rdma/fabric.h>

#include <utility>

#include "core/logging.h"

namespace smddp::ofi {

inline const char* class_name(size_t fclass) {
  switch (fclass) {
    case FI_CLASS_FABRIC: return "fabric";
    case FI_CLASS_DOMAIN: return "domain";
    case FI_CLASS_EP: return "endpoint";
    case FI_CLASS_AV: return "address vector";
    case FI_CLASS_MR: return "memory region";
    case FI_CLASS_CQ: return "completion queue";
    default: return "libfabric object";
  }
}

template <class T>
class FidOwner {
 public:
  FidOwner() = default;
  explicit FidOwner(T* p) : p_(p) {}
  ~FidOwner() { reset(); }
  FidOwner(FidOwner&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  FidOwner& operator=(FidOwner&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  FidOwner(const FidOwner&) = delete;
  FidOwner& operator=(const FidOwner&) = delete;

  T* get() const { return p_; }
  T** out() {
    reset();
    return &p_;
  }
  void reset() {
    // A close the provider refuses (busy) leaves the object, and what it holds, open: say so,
    // since nothing else would (docs/reliability.md: a leak found this way).
    if (p_) {
      if (const int rc = fi_close(&p_->fid); rc != 0) {
        SMDDP_LOG(INFO, -1) << "libfabric: closing a " << class_name(p_->fid.fclass) << " failed: " << fi_strerror(-rc)
                            << " (" << rc << "); it stays open";
      }
    }
    p_ = nullptr;
  }

 private:
  T* p_ = nullptr;
};

// fi_info lists are freed, not closed.
class InfoOwner {
 public:
  InfoOwner() = default;
  explicit InfoOwner(fi_info* p) : p_(p) {}
  ~InfoOwner() {
    if (p_) fi_freeinfo(p_);
  }
  InfoOwner(InfoOwner&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  InfoOwner& operator=(InfoOwner&& o) noexcept {
    if (this != &o) {
      if (p_) fi_freeinfo(p_);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  InfoOwner(const InfoOwner&) = delete;
  InfoOwner& operator=(const InfoOwner&) = delete;
  fi_info* get() const { return p_; }
  fi_info** out() { return &p_; }

 private:
  fi_info* p_ = nullptr;
};

}  // namespace smddp::ofi
