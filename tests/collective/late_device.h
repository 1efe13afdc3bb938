// A test device whose work lands late, as on a GPU: host memory, but every copy and reduction
// runs later on a worker thread (a stream), after a delay, and fence() waits for the queue. An
// algorithm that tells its peers (or the network) about data before fencing shows stale bytes
// (async_device_test.cc, cross_node_staging_test.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "device/device.h"

namespace smddp::testing {

// Host memory, but every copy and reduction runs later on a worker thread, after a delay.
class LateDevice final : public device::Device {
 public:
  LateDevice() : worker_([this] { loop(); }) {}
  ~LateDevice() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  const char* name() const override { return "late"; }
  void copy(void* dst, const void* src, size_t bytes) override {
    enqueue([=] { device::host().copy(dst, src, bytes); });
  }
  void reduce(const reduce::ReduceArgs& args) override {
    // The sources' addresses are the caller's to reuse once this returns: keep a copy.
    auto srcs = std::make_shared<std::vector<const void*>>(args.srcs, args.srcs + args.nsrc);
    reduce::ReduceArgs a = args;
    enqueue([a, srcs]() mutable {
      a.srcs = srcs->data();
      device::host().reduce(a);
    });
  }
  void fence() override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return queue_.empty() && !busy_; });
  }

 private:
  void enqueue(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(std::move(f));
    }
    cv_.notify_all();
  }
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      auto f = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      l.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(300));  // late, like a busy stream
      f();
      l.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  std::thread worker_;
};

}  // namespace smddp::testing
