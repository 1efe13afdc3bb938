// Every node algorithm of the registry on an asynchronous device: copies and reductions are
// queued to a worker thread (a stream) and land late, as on a GPU. An algorithm that tells its
// peers a round is done before its device work landed lets them read stale slots and outputs;
// Context::arrive() fences the device first, and this test fails when that fence is missing
// (checked by removing it). The single-copy algorithms run on a mapped arena (the IPC shape), so
// this is the configuration GPUs will run, on CPUs. Cases come from the registry: a new node
// algorithm is tested here the day it is registered.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/scratch_pool.h"
#include "collective/algorithm_cases.h"
#include "collective/mapped_windows.h"

namespace smddp::testing {
namespace {

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

class AsyncDevice : public ::testing::TestWithParam<int> {};

TEST_P(AsyncDevice, EveryNodeAlgorithmFencesBeforeItsPeersRead) {
  auto res = run_ranks(GetParam(), [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    MappedWindows arena(16 << 20);
    shm::GroupConfig cfg;
    cfg.slot_bytes = 4096;  // 1024 floats: the larger counts take several chunks
    shm::Group g(*store, rank, w, cfg, std::chrono::seconds(120));
    LateDevice late;
    const int ran = run_every_node_algorithm(g, late, arena, &arena, rep);
    if (ran < 13) rep.fail("only " + std::to_string(ran) + " node algorithms registered: the registry shrank?");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

INSTANTIATE_TEST_SUITE_P(World, AsyncDevice, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "w" + std::to_string(i.param); });

}  // namespace
}  // namespace smddp::testing
