#include "transport/ofi/completion_wait.h"

#include <poll.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "core/config.h"
#include "core/logging.h"
#include "smddp/errors.h"

namespace smddp::ofi {

enum fi_wait_obj wanted_wait_object(const std::string& provider) {
  const std::string how = config::get_string("SMDDP_OFI_WAIT");
  if (how == "poll") return FI_WAIT_NONE;
  if (how == "fd") return FI_WAIT_FD;
  if (how != "auto")
    throw InvalidArgument("smddp: SMDDP_OFI_WAIT is '" + how + "': expected auto (the default), fd or poll");
  return provider == "tcp" || provider == "tcp;ofi_rxm" ? FI_WAIT_FD : FI_WAIT_NONE;
}

CompletionWait::CompletionWait(fid_fabric* fabric, fid_cq* cq, enum fi_wait_obj wait_obj)
    : fabric_(fabric), cq_(cq) {
  if (!fabric || !cq || wait_obj != FI_WAIT_FD) return;
  int fd = -1;
  if (fi_control(&cq->fid, FI_GETWAIT, &fd) != 0 || fd < 0) return;
  event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0) throw SystemError("smddp: eventfd for the network's completion wait failed: errno " +
                                       std::to_string(errno));
  cq_fd_ = fd;  // the queue's own: closed with it
}

CompletionWait::~CompletionWait() {
  if (event_fd_ >= 0) ::close(event_fd_);
}

bool CompletionWait::trywait() {
  if (cq_fd_ < 0) return false;
  fid* fids[1] = {&cq_->fid};
  return fi_trywait(fabric_, fids, 1) == FI_SUCCESS;
}

void CompletionWait::sleep(const std::function<bool()>& ready, const std::function<bool()>& may_block,
                           std::chrono::microseconds timeout) {
  // Dekker's pattern with wake(): the waker stores its news and then reads sleeping_, this
  // sleeper stores sleeping_ and then reads the news (ready()); one of the two sees the other.
  sleeping_.store(true, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!ready()) {
    if (cq_fd_ >= 0 && may_block()) {
      pollfd fds[2] = {{cq_fd_, POLLIN, 0}, {event_fd_, POLLIN, 0}};
      const auto us = timeout.count();
      const timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
      ::ppoll(fds, 2, &ts, nullptr);  // EINTR: a wake-up like any other
    } else {
      std::this_thread::sleep_for(std::min(timeout, std::chrono::microseconds(50)));
    }
  }
  sleeping_.store(false, std::memory_order_seq_cst);
  if (event_fd_ >= 0) {
    uint64_t n;
    while (::read(event_fd_, &n, sizeof n) == static_cast<ssize_t>(sizeof n)) {
    }
  }
}

void CompletionWait::wake() {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the caller's news before sleeping_ (sleep())
  if (event_fd_ < 0 || !sleeping_.load(std::memory_order_seq_cst)) return;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(event_fd_, &one, sizeof one);  // full (never here): it is awake anyway
}

}  // namespace smddp::ofi
