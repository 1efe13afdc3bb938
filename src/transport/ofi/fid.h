// RAII owners for libfabric objects (in the manner of aws-ofi-nccl): every fid_* the transport
// opens is closed exactly once, in reverse order of opening, whatever path leaves the scope.
#pragma once

#include <rdma/fabric.h>

#include <utility>

namespace smddp::ofi {

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
    if (p_) fi_close(&p_->fid);
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
