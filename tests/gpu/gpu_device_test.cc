// The GPU suite's C++ half: the CUDA device layer (src/device/cuda) under every node algorithm
// and every reduction, on device memory, checked against plain loops on the host. Without a
// usable GPU (no device, no driver, or a build without CUDA) every test here is skipped with the
// reason, never passed. The probe runs in a child process: CUDA must not be initialised in this
// one, because the ranks are forked from it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/scratch_pool.h"
#include "collective/algorithm_cases.h"
#include "core/host_staging.h"
#include "collective/reference.h"
#include "device/cuda.h"
#include "smddp/communicator.h"

namespace smddp::testing {
namespace {

struct Probe {
  bool usable = false;
  int devices = 0;
  std::string why;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int fds[2];
    if (::pipe(fds) != 0) return Probe{false, 0, "pipe failed"};
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      std::string why;
      const bool ok = device::cuda_usable(&why);
      const std::string msg = std::string(ok ? "1 " : "0 ") + std::to_string(ok ? device::cuda_device_count() : 0) +
                              " " + why;
      (void)!::write(fds[1], msg.data(), msg.size());
      ::_exit(0);
    }
    ::close(fds[1]);
    std::string msg;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (msg.size() < 3) return Probe{false, 0, "the CUDA probe process died (status " + std::to_string(status) + ")"};
    r.usable = msg[0] == '1';
    const size_t sp = msg.find(' ', 2);
    r.devices = std::stoi(msg.substr(2, sp - 2));
    r.why = sp == std::string::npos ? "" : msg.substr(sp + 1);
    return r;
  }();
  return p;
}

// The CUDA driver starts threads of its own with a process's first context, for the process's
// life: made before the harness counts threads, so they do not read as a leak. On an H100 each
// test takes seconds: past 3 minutes it hangs, and the lease of a lent GPU is short.
RunOptions gpu_options() {
  RunOptions ro;
  ro.wall_limit = std::chrono::seconds(180);
  ro.before_thread_count = [] {
    for (int d = 0; d < device::cuda_device_count(); ++d) device::cuda_device(d);
  };
  return ro;
}

#define SKIP_WITHOUT_GPU()                                                 \
  do {                                                                     \
    if (!probe().usable) GTEST_SKIP() << "no usable GPU: " << probe().why; \
  } while (0)

// Device memory for a rank's cases: one cudaMalloc (so one IPC handle, opened once per peer and
// then found in the windows' cache), handed out by bumping.
class CudaArena {
 public:
  explicit CudaArena(size_t bytes) : bytes_(bytes), base_(static_cast<std::byte*>(device::cuda_malloc(bytes))) {}
  ~CudaArena() { device::cuda_free(base_); }
  template <class T>
  T* alloc(size_t n) {
    const size_t at = (used_ + 255) / 256 * 256;
    if (at + n * sizeof(T) > bytes_) throw std::runtime_error("CUDA test arena full");
    used_ = at + n * sizeof(T);
    return reinterpret_cast<T*>(base_ + at);
  }
  void reset() { used_ = 0; }

 private:
  size_t bytes_, used_ = 0;
  std::byte* base_;
};

// Room past a buffer for the offsets of the reduction test.
constexpr size_t kVectorOverhang = 16;

// Every dtype x op the library accepts, 1 to 8 sources, reduced by the kernels on device memory
// (and, with pageable host operands, by the host path) against reference.h's loop. Both kernels
// (SMDDP_CUDA_VECTOR_REDUCE): the operands at offset 0, all one element in (the vector kernel's
// scalar head), the first source alone one element in (no vectors at all), and in place (the
// destination is the first source); the counts leave scalar tails.
class GpuReduce : public ::testing::TestWithParam<bool> {};

TEST_P(GpuReduce, EveryDtypeOpAndSourceCountMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const bool vectors = GetParam();
  auto res = run_ranks(1, [vectors](int, int, std::shared_ptr<Store>, Report& rep) {
    ::setenv("SMDDP_CUDA_VECTOR_REDUCE", vectors ? "1" : "0", 1);  // read when the device is made
    auto dev = device::cuda_device(0);
    const DataType types[] = {DataType::f32, DataType::f64, DataType::f16, DataType::bf16, DataType::i8,
                              DataType::u8,  DataType::i32, DataType::i64, DataType::boolean};
    const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg,
                            ReduceOp::band, ReduceOp::bor, ReduceOp::bxor, ReduceOp::premul_sum};
    enum Shift { none, all, first_source, in_place };
    for (DataType t : types)
      for (ReduceOp o : ops) {
        if (!supports(t, o)) continue;
        const Reduction red = o == ReduceOp::premul_sum ? Reduction::premul_sum(0.5) : Reduction(o);
        for (int nsrc : {1, 2, 3, 8})
          for (size_t count : {size_t{1}, size_t{1000}, size_t{65537}})
            for (Shift shift : {none, all, first_source, in_place})
              for (bool host_operand : {false, true}) {
                if (host_operand && shift != none) continue;
                const size_t es = dtype_size(t), bytes = count * es;
                std::vector<std::vector<std::byte>> host(static_cast<size_t>(nsrc), std::vector<std::byte>(bytes));
                std::vector<void*> bufs;
                std::vector<const void*> srcs;
                // Device memory `by` bytes past a fresh allocation's start (256-byte aligned).
                auto device_buffer = [&](size_t by) {
                  bufs.push_back(device::cuda_malloc(bytes + kVectorOverhang));
                  return static_cast<std::byte*>(bufs.back()) + by;
                };
                for (int s = 0; s < nsrc; ++s) {
                  for (size_t i = 0; i < count; ++i) store_value(host[static_cast<size_t>(s)].data(), i, t, input_value(s, i, t, o, 7));
                  // host_operand: the last source stays in pageable host memory (a shm slot's case)
                  if (host_operand && s == nsrc - 1) {
                    srcs.push_back(host[static_cast<size_t>(s)].data());
                    continue;
                  }
                  std::byte* b = device_buffer(shift == all || (shift == first_source && s == 0) ? es : 0);
                  dev->copy(b, host[static_cast<size_t>(s)].data(), bytes);
                  srcs.push_back(b);
                }
                void* dst = shift == in_place ? const_cast<void*>(srcs[0]) : device_buffer(shift == all ? es : 0);
                reduce::ReduceArgs a{dst, srcs.data(), nsrc, count, t, red, nsrc};
                dev->reduce(a);
                std::vector<std::byte> got(bytes);
                dev->copy(got.data(), dst, bytes);
                dev->fence();
                for (void* b : bufs) device::cuda_free(b);
                static const char* const shifts[] = {"", ", every operand one element in", ", the first source one element in",
                                                     ", in place"};
                for (size_t i = 0; i < count; ++i) {
                  const double want = reference_value(nsrc, i, t, red, 7), v = load_value(got.data(), i, t);
                  if (std::fabs(v - want) > tolerance(t, want)) {
                    rep.fail(std::string(vectors ? "vector kernel: " : "scalar kernel: ") + to_string(t) + " " +
                             to_string(o) + " of " + std::to_string(nsrc) + " sources, count " + std::to_string(count) +
                             shifts[shift] + (host_operand ? " (one on the host)" : "") + ": element " +
                             std::to_string(i) + " is " + std::to_string(v) + ", expected " + std::to_string(want));
                    return;
                  }
                }
              }
      }
  }, gpu_options());
  ASSERT_TRUE(res.ok()) << res.summary();
}
INSTANTIATE_TEST_SUITE_P(Kernel, GpuReduce, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "vector" : "scalar"; });

// Every node algorithm of the registry with device buffers, the CUDA device and CUDA IPC
// windows: the configuration a GPU node runs. Ranks share the GPUs there are (rank % count), so
// one GPU runs 4 ranks.
// Staging in pieces (core/host_staging.h: CUDA memory across nodes) on device memory and the
// GPU's stream: the next piece copied in and the last one out while a piece runs, the rank
// blocks of allgather and reduce_scatter gathered and scattered by one 2D copy each
// (Device::copy_rows, cudaMemcpy2DAsync), into page-locked host buffers as the communicator's.
// Each piece's collective is played on its host buffer by the test, as in
// tests/unit/pipelined_staging_test.cc: the GPU machine has no libfabric for pretend nodes.
TEST(GpuStaging, PiecesGatherAndScatterTheRankBlocksOnDeviceMemory) {
  SKIP_WITHOUT_GPU();
  auto res = run_ranks(1, [](int, int, std::shared_ptr<Store>, Report& rep) {
    using algorithms::CollArgs;
    using algorithms::CollKind;
    auto dev = device::cuda_device(0);
    algorithms::ScratchPool pool([](const void* p, size_t n) { device::cuda_register_host(const_cast<void*>(p), n); },
                                 [](const void* p, size_t) { device::cuda_unregister_host(const_cast<void*>(p)); });
    const int w = 3, me = 1;
    const size_t n = 8 * 5 + 1, W = w, piece_bytes = 96;  // 8 floats of each block a piece (24 of allreduce)
    auto input = [](size_t r, size_t i) { return static_cast<float>(1000 * r + i); };
    auto to_device = [&](const std::vector<float>& h) {
      float* d = static_cast<float*>(device::cuda_malloc(h.size() * sizeof(float)));
      dev->copy(d, h.data(), h.size() * sizeof(float));
      return d;
    };
    auto to_host = [&](const float* d, size_t count) {
      std::vector<float> h(count);
      dev->copy(h.data(), d, count * sizeof(float));
      dev->fence();
      return h;
    };
    auto run = [&](CollKind kind, const float* send, float* recv, auto play) {
      CollArgs a;
      a.kind = kind;
      a.send = send;
      a.recv = recv;
      a.count = n;
      a.memory = Memory::cuda(0);
      detail::PipelinedStaging(pool, *dev, a, me, w, piece_bytes).run([&](const CollArgs& p, size_t k) {
        play(p, k * (kind == CollKind::allreduce ? 24 : 8));
      });
    };
    auto expect = [&](const std::string& what, const std::vector<float>& got, auto want) {
      for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != want(i)) {
          rep.fail(what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
                   std::to_string(want(i)));
          return;
        }
    };

    std::vector<float> mine(n), all(n * W), none(n * W, -1.0f);
    for (size_t i = 0; i < n; ++i) mine[i] = input(me, i);
    for (size_t i = 0; i < n * W; ++i) all[i] = input(i / n, i % n);
    float* s = to_device(mine);
    float* r = to_device(none);
    run(CollKind::allreduce, s, r, [&](const CollArgs& p, size_t) {
      for (size_t j = 0; j < p.count; ++j) static_cast<float*>(p.recv)[j] *= 3;
    });
    expect("allreduce in pieces", to_host(r, n), [&](size_t i) { return 3 * input(me, i); });

    run(CollKind::allgather, s, r, [&](const CollArgs& p, size_t first) {
      float* h = static_cast<float*>(p.recv);
      for (size_t j = 0; j < p.count; ++j)
        for (size_t b = 0; b < W; ++b)
          if (b != static_cast<size_t>(me)) h[b * p.count + j] = input(b, first + j);
    });
    expect("allgather in pieces", to_host(r, n * W), [&](size_t i) { return input(i / n, i % n); });

    float* big = to_device(all);
    float* out = to_device(none);
    run(CollKind::reduce_scatter, big, out, [&](const CollArgs& p, size_t) {
      float* h = const_cast<float*>(static_cast<const float*>(p.send));
      for (size_t j = 0; j < p.count; ++j) {
        float sum = 0;
        for (size_t b = 0; b < W; ++b) sum += h[b * p.count + j];
        h[static_cast<size_t>(me) * p.count + j] = sum;
      }
    });
    expect("reduce_scatter in pieces", to_host(out, n), [&](size_t i) {
      float sum = 0;
      for (size_t b = 0; b < W; ++b) sum += input(b, i);  // what the play summed: element i of every block
      return sum;
    });
    for (float* d : {s, r, big, out}) device::cuda_free(d);
  }, gpu_options());
  ASSERT_TRUE(res.ok()) << res.summary();
}

class GpuAlgorithms : public ::testing::TestWithParam<int> {};

TEST_P(GpuAlgorithms, EveryNodeAlgorithmOnDeviceMemory) {
  SKIP_WITHOUT_GPU();
  const int gpus = probe().devices;
  auto res = run_ranks(GetParam(), [gpus](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    auto dev = device::cuda_device(rank % gpus);
    CudaArena arena(16 << 20);
    auto windows = device::cuda_ipc_windows(*dev);
    shm::GroupConfig cfg;
    cfg.slot_bytes = 4096;  // the larger counts take several chunks
    shm::Group g(*store, rank, w, cfg, std::chrono::seconds(120));
    const int ran = run_every_node_algorithm(g, *dev, arena, windows.get(), rep);
    if (ran < 13) rep.fail("only " + std::to_string(ran) + " node algorithms registered");
  }, gpu_options());
  ASSERT_TRUE(res.ok()) << res.summary();
}

INSTANTIATE_TEST_SUITE_P(World, GpuAlgorithms, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "w" + std::to_string(i.param); });

// Host memory cannot be exposed through CUDA IPC (the algorithm must stage); device memory can,
// and a peer's buffer opened twice maps once (the handle cache).
TEST(GpuWindows, ExposeRefusesHostMemoryAndCachesPeerHandles) {
  SKIP_WITHOUT_GPU();
  auto res = run_ranks(2, [](int rank, int, std::shared_ptr<Store> store, Report& rep) {
    auto dev = device::cuda_device(0);
    auto windows = device::cuda_ipc_windows(*dev);
    std::vector<float> host(64);
    std::byte desc[device::PeerWindows::kDescriptorBytes];
    if (windows->expose(host.data(), 256, desc)) rep.fail("pageable host memory was exposed through CUDA IPC");
    CudaArena arena(1 << 20);
    float* buf = arena.alloc<float>(256);
    // Index-dependent values: a read that ignored the exposed offset (16 floats in) or the
    // read's own offset would see other numbers.
    std::vector<float> mine(256);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>((rank + 1) * 1000 + static_cast<int>(i));
    dev->copy(buf, mine.data(), 1024);
    dev->fence();
    if (!windows->expose(buf + 16, 960, desc)) return rep.fail("cudaMalloc memory could not be exposed");
    store->set("desc" + std::to_string(rank), std::vector<uint8_t>(reinterpret_cast<uint8_t*>(desc),
                                                                    reinterpret_cast<uint8_t*>(desc) + sizeof desc));
    const auto theirs = store->get("desc" + std::to_string(1 - rank), std::chrono::seconds(60));
    const auto a = windows->open(1 - rank, reinterpret_cast<const std::byte*>(theirs.data()));
    const auto b = windows->open(1 - rank, reinterpret_cast<const std::byte*>(theirs.data()));
    if (a.mapped != b.mapped || !a.mapped) rep.fail("a peer's buffer opened twice came back at two addresses");
    if (const size_t n = device::cuda_ipc_opens(*windows); n != 1)
      rep.fail("a peer's buffer opened twice called cudaIpcOpenMemHandle " + std::to_string(n) + " times (no cache)");
    OpInfo op;
    op.name = "test";
    std::vector<float> got(4, 0);
    float* stage = arena.alloc<float>(4);
    windows->read(a, 8, stage, 16, op);  // bytes 8..24 of the exposed range: floats 18..21
    dev->copy(got.data(), stage, 16);
    dev->fence();
    const int peer = 1 - rank;
    for (int i = 0; i < 4; ++i)
      if (got[static_cast<size_t>(i)] != static_cast<float>((peer + 1) * 1000 + 18 + i))
        rep.fail("read " + std::to_string(got[static_cast<size_t>(i)]) + " from the peer at float " +
                 std::to_string(18 + i) + ", expected " + std::to_string((peer + 1) * 1000 + 18 + i));
    try {
      windows->read(a, 960, stage, 4, op);
      rep.fail("a read past the exposed bytes was allowed");
    } catch (const InvalidArgument&) {
    }
    store->set("done" + std::to_string(rank), {1});
    (void)store->get("done" + std::to_string(1 - rank), std::chrono::seconds(60));  // the peer finished reading this buffer
  }, gpu_options());
  ASSERT_TRUE(res.ok()) << res.summary();
}

// The public API on CUDA memory: allreduce, allgather and reduce_scatter through a Communicator
// with Memory::cuda, w=2 sharing GPU 0 (or one each), against plain sums.
TEST(GpuCommunicator, CollectivesOnCudaMemory) {
  SKIP_WITHOUT_GPU();
  const int gpus = probe().devices;
  auto res = run_ranks(2, [gpus](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    const int gpu = rank % gpus;
    Communicator comm(store, rank, w);
    const size_t n = (1 << 18) + 5;  // past the one-shot size: the chunked algorithms
    std::vector<float> host(n * 2);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 97);
    auto dev = device::cuda_device(gpu);  // first: it makes `gpu` current, where cuda_malloc allocates
    auto* in = static_cast<float*>(device::cuda_malloc(host.size() * sizeof(float)));
    auto* out = static_cast<float*>(device::cuda_malloc(host.size() * sizeof(float)));
    dev->copy(in, host.data(), host.size() * sizeof(float));
    dev->fence();
    std::vector<float> got(n * 2);
    auto expect = [&](const char* what, size_t count, auto want) {
      dev->copy(got.data(), out, count * sizeof(float));
      dev->fence();
      for (size_t i = 0; i < count; ++i)
        if (got[i] != want(i)) {
          rep.fail(std::string(what) + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                   ", expected " + std::to_string(want(i)));
          return;
        }
    };
    comm.allreduce(in, out, n, DataType::f32, ReduceOp::sum, Memory::cuda(gpu)).wait();
    expect("allreduce", n, [](size_t i) { return 3.0f * static_cast<float>(i % 97); });
    comm.allgather(in, out, n, DataType::f32, Memory::cuda(gpu)).wait();
    expect("allgather", 2 * n, [n](size_t i) { return static_cast<float>(i / n + 1) * static_cast<float>((i % n) % 97); });
    comm.reduce_scatter(in, out, n, DataType::f32, ReduceOp::sum, Memory::cuda(gpu)).wait();
    expect("reduce_scatter", n,
           [&](size_t i) { return 3.0f * static_cast<float>((static_cast<size_t>(rank) * n + i) % 97); });
    // Stream order: the input is still to be written on the caller's stream when the call is
    // made, with no host sync; the collective must wait for it (Memory::stream), and so must
    // the peer reading this rank's buffer through IPC. The caller's stream is kept busy for
    // milliseconds first (device-to-device copies of 256 MiB) and then writes the input from
    // device memory, all asynchronous: a collective that did not wait would read the old input.
    std::vector<float> fresh(n);
    for (size_t i = 0; i < n; ++i) fresh[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 89);
    auto caller = device::cuda_device(gpu);
    constexpr size_t kBusyBytes = size_t{256} << 20;
    void* busy[2] = {device::cuda_malloc(kBusyBytes), device::cuda_malloc(kBusyBytes)};
    void* staged = device::cuda_malloc(n * sizeof(float));
    dev->copy(staged, fresh.data(), n * sizeof(float));
    dev->copy(out, host.data(), n * sizeof(float));  // stale values where the result goes
    dev->fence();
    for (int k = 0; k < 8; ++k) caller->copy(busy[k % 2], busy[1 - k % 2], kBusyBytes);
    caller->copy(in, staged, n * sizeof(float));
    comm.allreduce(in, out, n, DataType::f32, ReduceOp::sum, Memory::cuda(gpu, device::cuda_stream(*caller))).wait();
    expect("allreduce after the caller's stream", n, [](size_t i) { return 3.0f * static_cast<float>(i % 89); });
    caller->fence();
    for (void* b : busy) device::cuda_free(b);
    device::cuda_free(staged);
    device::cuda_free(in);
    device::cuda_free(out);
  }, gpu_options());
  ASSERT_TRUE(res.ok()) << res.summary();
}

// Point to point on CUDA memory (core/p2p_staging.h), w=2 sharing GPU 0 (or one each): rank 0's
// message is written on the caller's stream, kept busy first, with no host sync at the call, so a
// send that did not wait for that stream would carry the old values; rank 1 receives into device
// memory, then sends it back to host memory on rank 0.
TEST(GpuCommunicator, PointToPointOnCudaMemoryFollowsTheCallersStream) {
  SKIP_WITHOUT_GPU();
  const int gpus = probe().devices;
  auto res = run_ranks(2, [gpus](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    const int gpu = rank % gpus;
    Communicator comm(store, rank, w);
    const size_t n = (size_t{1} << 20) + 3;
    auto dev = device::cuda_device(gpu);  // first: it makes `gpu` current, where cuda_malloc allocates
    auto caller = device::cuda_device(gpu);
    auto* buf = static_cast<float*>(device::cuda_malloc(n * sizeof(float)));
    std::vector<float> host(n), got(n, -1.0f);
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1013);
    if (rank == 0) {
      constexpr size_t kBusyBytes = size_t{256} << 20;
      void* busy[2] = {device::cuda_malloc(kBusyBytes), device::cuda_malloc(kBusyBytes)};
      void* fresh = device::cuda_malloc(n * sizeof(float));
      std::vector<float> stale(n, -3.0f);
      dev->copy(fresh, host.data(), n * sizeof(float));
      dev->copy(buf, stale.data(), n * sizeof(float));
      dev->fence();
      for (int k = 0; k < 8; ++k) caller->copy(busy[k % 2], busy[1 - k % 2], kBusyBytes);
      caller->copy(buf, fresh, n * sizeof(float));
      comm.send(buf, n, DataType::f32, 1, 1, Memory::cuda(gpu, device::cuda_stream(*caller))).wait();
      comm.recv(got.data(), n, DataType::f32, 1, 2).wait();  // into host memory
      caller->fence();
      for (void* b : busy) device::cuda_free(b);
      device::cuda_free(fresh);
    } else {
      comm.recv(buf, n, DataType::f32, 0, 1, Memory::cuda(gpu)).wait();
      comm.send(buf, n, DataType::f32, 0, 2, Memory::cuda(gpu)).wait();
      dev->copy(got.data(), buf, n * sizeof(float));
      dev->fence();
    }
    for (size_t i = 0; i < n; ++i)
      if (got[i] != host[i]) {
        rep.fail("element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
                 std::to_string(host[i]));
        break;
      }
    device::cuda_free(buf);
  }, gpu_options());
  ASSERT_TRUE(res.ok()) << res.summary();
}

// Without a usable GPU, a collective on CUDA memory is refused at the call with the op and the
// reason, and the communicator goes on working on host memory. (With a GPU, an unknown device
// ordinal is refused the same way.)
TEST(GpuCommunicator, UnusableCudaMemoryIsAClearErrorAtTheCall) {
  const bool usable = probe().usable;
  const int gpus = probe().devices;
  auto res = run_ranks(2, [usable, gpus](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Communicator comm(store, rank, w);
    std::vector<float> a(8, 1.0f), b(8);
    const int bad_device = usable ? gpus : 0;
    try {
      comm.allreduce(a.data(), b.data(), 8, DataType::f32, ReduceOp::sum, Memory::cuda(bad_device));
      rep.fail("a collective on unusable CUDA memory was accepted");
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      const std::string want = usable ? "no such device" : probe().why;
      if (m.find("allreduce on CUDA device " + std::to_string(bad_device)) == std::string::npos ||
          m.find("rank " + std::to_string(rank)) == std::string::npos || m.find(want) == std::string::npos)
        rep.fail("unclear error: " + m);
    }
    // Point to point alike (checked on the caller's thread, before anything is queued).
    const int peer = 1 - rank;
    for (const char* op : {"send", "recv"}) {
      try {
        if (std::string(op) == "send") comm.send(a.data(), 8, DataType::f32, peer, 0, Memory::cuda(bad_device));
        else comm.recv(b.data(), 8, DataType::f32, peer, 0, Memory::cuda(bad_device));
        rep.fail(std::string("a ") + op + " on unusable CUDA memory was accepted");
      } catch (const InvalidArgument& e) {
        const std::string m = e.what();
        if (m.find(std::string(op) + " on CUDA device " + std::to_string(bad_device)) == std::string::npos)
          rep.fail("unclear error: " + m);
      }
    }
    comm.allreduce(a.data(), b.data(), 8, DataType::f32, ReduceOp::sum).wait();
    if (b[0] != 2.0f) rep.fail("host allreduce after the refusal gave " + std::to_string(b[0]));
  }, gpu_options());
  ASSERT_TRUE(res.ok()) << res.summary();
}

}  // namespace
}  // namespace smddp::testing
