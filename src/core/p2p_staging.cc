#include "core/p2p_staging.h"

#include <utility>

#include "device/cuda.h"

namespace smddp::detail {

P2pStagingPool::Lease P2pStagingPool::take(size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  size_t slot;
  if (free_.empty()) {
    slot = slots_++;
  } else {
    slot = free_.back();
    free_.pop_back();
  }
  std::byte* data = nullptr;
  try {
    data = pool_.get(slot, bytes);
  } catch (...) {  // no memory, or the network refused to register it: the slot stays free
    free_.push_back(slot);
    throw;
  }
  ++out_;
  return Lease(this, slot, data);
}

void P2pStagingPool::give_back(size_t slot) {
  std::lock_guard<std::mutex> g(mu_);
  free_.push_back(slot);
  // A one-off huge message does not stay page-locked; an abandoned buffer is never freed early.
  if (--out_ == 0 && abandoned_ == 0) pool_.trim(keep_);
}

void P2pStagingPool::set_aside() {
  std::lock_guard<std::mutex> g(mu_);
  --out_;
  ++abandoned_;
}

size_t P2pStagingPool::leased() const {
  std::lock_guard<std::mutex> g(mu_);
  return out_;
}

StagedP2p::StagedP2p(bool is_send, void* buffer, size_t bytes, P2pStagingPool::Lease host,
                     std::function<device::Device&()> device, std::shared_ptr<void> ready, P2pPoll host_poll)
    : is_send_(is_send), buffer_(buffer), bytes_(bytes), host_(std::move(host)), device_(std::move(device)),
      ready_(std::move(ready)), host_poll_(std::move(host_poll)) {}

device::Device& StagedP2p::dev() {
  if (!dev_) {
    dev_ = &device_();
    if (ready_) device::cuda_wait(*dev_, ready_.get());
  }
  return *dev_;
}

StagedP2p::~StagedP2p() {
  if (polled_ && !done_) host_.abandon();
}

bool StagedP2p::poll(shm::Group& g, const OpInfo& op) {
  g.throw_if_aborted(op);  // before any copy (the host operation looks again)
  polled_ = true;
  if (is_send_ && !copied_in_) {
    if (bytes_ > 0) {
      dev().copy(host_.data(), buffer_, bytes_);
      dev().fence();
    }
    copied_in_ = true;
  }
  if (!host_poll_(g, op)) return false;
  if (!is_send_ && bytes_ > 0) {
    dev().copy(buffer_, host_.data(), bytes_);
    dev().fence();  // the receive is complete when its bytes are in the buffer
  }
  done_ = true;
  return true;
}

}  // namespace smddp::detail
