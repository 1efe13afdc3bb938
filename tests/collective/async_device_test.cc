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

#include "algorithms/registry.h"
#include "algorithms/scratch_pool.h"
#include "collective/harness.h"
#include "collective/mapped_windows.h"

namespace smddp::testing {
namespace {

using algorithms::CollArgs;
using algorithms::CollKind;

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

float value(int rank, size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i % 991)); }

// Runs `algo` once with `count` (elements per block) and checks every output element.
void run_and_check(algorithms::Context& ctx, MappedWindows& arena, const algorithms::Algorithm& algo, size_t count,
                   Report& rep) {
  const int w = ctx.size(), me = ctx.rank(), root = 1 % w;
  const auto W = static_cast<size_t>(w);
  const std::string name = std::string(algorithms::to_string(algo.kind)) + ":" + algo.name + " count " +
                           std::to_string(count) + ": ";
  arena.reset();
  CollArgs a;
  a.kind = algo.kind, a.count = count, a.dtype = DataType::f32, a.op = Reduction{ReduceOp::sum}, a.root = root;
  size_t in_n = count, out_n = count;
  switch (algo.kind) {
    case CollKind::allgather: case CollKind::gather: out_n = count * W; break;
    case CollKind::reduce_scatter: case CollKind::scatter: case CollKind::alltoall: in_n = count * W; break;
    default: break;
  }
  if (algo.kind == CollKind::alltoall) out_n = count * W;
  float* in = arena.alloc<float>(in_n);
  float* out = arena.alloc<float>(out_n);
  for (size_t i = 0; i < in_n; ++i) in[i] = value(me, i);
  for (size_t i = 0; i < out_n; ++i) out[i] = -1;
  if (algo.kind == CollKind::broadcast && me == root) std::copy(in, in + count, out);
  for (int j = 0; j < w; ++j) {
    a.send_counts.push_back(count), a.recv_counts.push_back(count);
    a.send_displs.push_back(static_cast<size_t>(j) * count), a.recv_displs.push_back(static_cast<size_t>(j) * count);
  }
  a.send = in, a.recv = out;
  algo.run(ctx, a);
  ctx.dev.fence();  // what run_collective does before it reports completion
  auto sum = [&](size_t i) {
    float s = 0;
    for (int r = 0; r < w; ++r) s += value(r, i);
    return s;
  };
  auto want = [&](size_t k) -> float {
    switch (algo.kind) {
      case CollKind::allreduce: return sum(k);
      case CollKind::reduce: return me == root ? sum(k) : -1;
      case CollKind::reduce_scatter: return sum(static_cast<size_t>(me) * count + k);
      case CollKind::allgather: return value(static_cast<int>(k / count), k % count);
      case CollKind::gather: return me == root ? value(static_cast<int>(k / count), k % count) : -1;
      case CollKind::broadcast: return value(root, k);
      case CollKind::scatter: return value(root, static_cast<size_t>(me) * count + k);
      case CollKind::alltoall: return value(static_cast<int>(k / count), static_cast<size_t>(me) * count + k % count);
      case CollKind::barrier: return -1;
    }
    return -1;
  };
  for (size_t k = 0; k < out_n; ++k) {
    // reduce: only the root's output is defined (the others' may be used as scratch).
    if (algo.kind == CollKind::reduce && me != root) break;
    if (out[k] != want(k)) {
      rep.fail(name + "element " + std::to_string(k) + " is " + std::to_string(out[k]) + ", expected " +
               std::to_string(want(k)));
      return;
    }
  }
}

class AsyncDevice : public ::testing::TestWithParam<int> {};

TEST_P(AsyncDevice, EveryNodeAlgorithmFencesBeforeItsPeersRead) {
  auto res = run_ranks(GetParam(), [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    MappedWindows arena(16 << 20);
    shm::GroupConfig cfg;
    cfg.slot_bytes = 4096;  // 1024 floats: the larger counts below take several chunks
    shm::Group g(*store, rank, w, cfg, std::chrono::seconds(120));
    algorithms::ScratchPool scratch;
    LateDevice late;
    int ran = 0;
    for (const auto& algo : algorithms::all()) {
      if (algo.scope != algorithms::Scope::node) continue;
      for (size_t count : {size_t{1}, size_t{300}, size_t{2500}}) {
        OpInfo op;
        op.name = algorithms::to_string(algo.kind);
        op.rank = rank, op.size = w, op.timeout = std::chrono::seconds(60);
        op.deadline = Clock::now() + op.timeout;
        algorithms::Context ctx{g, late, op, nullptr, nullptr, nullptr, &scratch, &arena};
        run_and_check(ctx, arena, algo, count, rep);
      }
      ++ran;
    }
    if (ran < 13) rep.fail("only " + std::to_string(ran) + " node algorithms registered: the registry shrank?");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

INSTANTIATE_TEST_SUITE_P(World, AsyncDevice, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "w" + std::to_string(i.param); });

}  // namespace
}  // namespace smddp::testing
