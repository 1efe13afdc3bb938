// The single-copy algorithms over both kinds of peer window (device/peer_window.h):
//  - a mapped window, the shape CUDA IPC has: "device memory" is an arena (a memfd) each rank
//    allocates its buffers from; a peer maps the arena once, on first use, and keeps it (the
//    handle cache); memory outside the arena cannot be exposed, and then every rank must fall
//    back to the staged algorithm. The reductions read the peers' memory in place.
//  - CMA (host memory), as the communicator uses it: reads copy through scratch.
// The algorithms run here directly on a shm::Group with a small staging slot, so every size
// below crosses several pipeline chunks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/registry.h"
#include "algorithms/scratch_pool.h"
#include "collective/direct_op.h"
#include "collective/harness.h"
#include "collective/mapped_windows.h"
#include "smddp/errors.h"

namespace smddp::testing {
namespace {

using algorithms::CollArgs;
using algorithms::CollKind;

float value(int rank, size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i % 997)); }

// Runs allreduce (out of and in place), allgather and reduce_scatter through the window
// algorithms with buffers from `alloc` (nullptr: plain heap memory), checks every element.
template <class Alloc>
void run_window_collectives(shm::Group& g, device::PeerWindows& win, Alloc alloc, Report& rep, const std::string& tag) {
  const int w = g.size(), me = g.rank();
  const auto W = static_cast<size_t>(w);
  algorithms::ScratchPool scratch;
  for (size_t count : {size_t{1}, size_t{777}, size_t{5000}}) {  // slot: 1024 floats
    const std::string at = tag + " count " + std::to_string(count) + ": ";
    auto sum = [&](size_t i) {
      float s = 0;
      for (int r = 0; r < w; ++r) s += value(r, i);
      return s;
    };
    for (bool in_place : {false, true}) {
      float* in = alloc(count);
      float* out = in_place ? in : alloc(count);
      for (size_t i = 0; i < count; ++i) in[i] = value(me, i);
      OpInfo op = op_for("allreduce", me, w);
      algorithms::Context ctx{g, device::host(), op, nullptr, nullptr, nullptr, &scratch, &win};
      CollArgs a;
      a.kind = CollKind::allreduce, a.send = in, a.recv = out, a.count = count, a.op = Reduction{ReduceOp::sum};
      algorithms::find(CollKind::allreduce, "window").run(ctx, a);
      for (size_t i = 0; i < count; ++i)
        if (out[i] != sum(i)) {
          rep.fail(at + "allreduce" + (in_place ? " in place" : "") + " wrong at " + std::to_string(i));
          break;
        }
    }
    {
      float* in = alloc(count);
      float* out = alloc(count * W);
      for (size_t i = 0; i < count; ++i) in[i] = value(me, i);
      OpInfo op = op_for("allgather", me, w);
      algorithms::Context ctx{g, device::host(), op, nullptr, nullptr, nullptr, &scratch, &win};
      CollArgs a;
      a.kind = CollKind::allgather, a.send = in, a.recv = out, a.count = count;
      algorithms::find(CollKind::allgather, "window").run(ctx, a);
      for (size_t k = 0; k < count * W; ++k)
        if (out[k] != value(static_cast<int>(k / count), k % count)) {
          rep.fail(at + "allgather wrong at " + std::to_string(k));
          break;
        }
    }
    {
      float* in = alloc(count * W);
      float* out = alloc(count);
      for (size_t k = 0; k < count * W; ++k) in[k] = value(me, k);
      OpInfo op = op_for("reduce_scatter", me, w);
      algorithms::Context ctx{g, device::host(), op, nullptr, nullptr, nullptr, &scratch, &win};
      CollArgs a;
      a.kind = CollKind::reduce_scatter, a.send = in, a.recv = out, a.count = count,
      a.op = Reduction{ReduceOp::sum};
      algorithms::find(CollKind::reduce_scatter, "window").run(ctx, a);
      for (size_t i = 0; i < count; ++i)
        if (out[i] != sum(static_cast<size_t>(me) * count + i)) {
          rep.fail(at + "reduce_scatter wrong at " + std::to_string(i));
          break;
        }
    }
  }
}

shm::GroupConfig small_slots() {
  shm::GroupConfig cfg;
  cfg.slot_bytes = 4096;
  return cfg;
}

class PeerWindow : public ::testing::TestWithParam<int> {};

// Reductions read the peers' arenas in place; each peer's arena is mapped once for all
// collectives (the cache), however many buffers were exposed.
TEST_P(PeerWindow, MappedWindowsReadPeersInPlaceAndMapEachPeerOnce) {
  auto res = run_ranks(GetParam(), [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    MappedWindows win(64 << 20);
    shm::Group g(*store, rank, w, small_slots(), std::chrono::seconds(60));
    run_window_collectives(g, win, [&](size_t n) { return win.alloc<float>(n); }, rep, "mapped");
    if (win.mapped_peers() != w - 1)
      rep.fail("mapped " + std::to_string(win.mapped_peers()) + " peer arenas, expected " + std::to_string(w - 1));
    if (win.open_calls() < 10 * (w - 1)) rep.fail("fewer opens than exposed buffers: the test exposed too little");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// One rank's buffers are not "device memory": no rank may read through windows (every rank
// learns it in the opening round and runs the staged algorithm), and the results are right.
TEST_P(PeerWindow, MemoryOneRankCannotExposeFallsBackToStagingOnEveryRank) {
  auto res = run_ranks(GetParam(), [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    MappedWindows win(64 << 20);
    shm::Group g(*store, rank, w, small_slots(), std::chrono::seconds(60));
    std::vector<std::vector<float>> heap;
    auto alloc = [&](size_t n) -> float* {
      if (rank != w - 1) return win.alloc<float>(n);
      heap.emplace_back(n);
      return heap.back().data();
    };
    run_window_collectives(g, win, alloc, rep, "fallback");
    if (win.open_calls() != 0) rep.fail(std::to_string(win.open_calls()) + " windows opened despite the fallback");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// One rank cannot open its peers' buffers although every rank exposed them (CUDA IPC between
// GPUs without peer access): it says so in the probe round, and every rank stages, with right
// results, instead of that rank failing while its peers wait for it. Later collectives of the
// same placement stage at once: the failing rank tries no more opens.
TEST_P(PeerWindow, MappedWindowsARankThatCannotOpenItsPeersMakesEveryRankStage) {
  auto res = run_ranks(GetParam(), [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    MappedWindows win(64 << 20);
    win.refuse_opens = rank == w - 1;
    shm::Group g(*store, rank, w, small_slots(), std::chrono::seconds(60));
    run_window_collectives(g, win, [&](size_t n) { return win.alloc<float>(n); }, rep, "unopenable");
    const auto& v = win.reachable_by_placement;
    if (v.empty()) rep.fail("no placement was probed");
    for (const auto& [key, ok] : v)
      if (ok) rep.fail("rank " + std::to_string(rank) + " took a placement as reachable");
    if (win.refuse_opens && win.open_calls() != static_cast<int>(v.size()))
      rep.fail("the failing rank tried " + std::to_string(win.open_calls()) + " opens for " +
               std::to_string(v.size()) + " placements: one each, then none");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// The ranks agree on reachability once per placement of the node's buffers, not once per
// communicator: a rank whose buffers move to another GPU, with windows of their own as the
// communicator keeps one set per GPU, makes every rank probe again, in step, and a placement seen
// before is not probed twice, although its verdict sits in windows the other ranks never used.
TEST_P(PeerWindow, MappedWindowsProbeOncePerPlacement) {
  auto res = run_ranks(GetParam(), [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    MappedWindows gpu0(64 << 20), gpu1(64 << 20);
    gpu1.where = 1;
    shm::Group g(*store, rank, w, small_slots(), std::chrono::seconds(60));
    auto run = [&](MappedWindows& win, const std::string& tag) {
      win.reset();
      run_window_collectives(g, win, [&](size_t n) { return win.alloc<float>(n); }, rep, tag);
    };
    run(gpu0, "on GPU 0");
    const size_t k = gpu0.reachable_by_placement.size();
    MappedWindows& moved = rank == 0 ? gpu1 : gpu0;  // rank 0 moves to GPU 1 and back
    run(moved, "rank 0 on GPU 1");
    run(gpu0, "on GPU 0 again");
    const size_t mine0 = gpu0.reachable_by_placement.size(), mine1 = gpu1.reachable_by_placement.size();
    const bool ok = k > 0 && (rank == 0 ? mine0 == k && mine1 == k : mine0 == 2 * k && mine1 == 0);
    if (!ok)
      rep.fail("placements probed: " + std::to_string(k) + " first, then " + std::to_string(mine0) + " in GPU 0's windows and " +
               std::to_string(mine1) + " in GPU 1's (rank 0 expects k and k, the others 2k and 0)");
    for (const auto* win : {&gpu0, &gpu1})
      for (const auto& [key, reached] : win->reachable_by_placement)
        if (!reached) rep.fail("a placement was taken as unreachable");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// Where this kernel has no cross-memory attach at all (cma_missing_here: qemu-user) the tests
// below assert the fallback (every rank stages, the reason named) instead of the reads. Any other
// failure to read this process's own memory is no environment to skip: the tests fail on it.

// Host memory the way communicators reach it: process_vm_readv through scratch (without it, every
// rank stages through the segment, with the same results).
TEST_P(PeerWindow, CmaWindowsReadHostMemory) {
  const bool missing = cma_missing_here();
  auto res = run_ranks(GetParam(), [missing](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    shm::Group g(*store, rank, w, small_slots(), std::chrono::seconds(60));
    auto win = device::cma_windows([&g](int r) { return g.pid_of(r); });
    std::vector<std::vector<float>> heap;
    run_window_collectives(g, *win, [&](size_t n) { heap.emplace_back(n); return heap.back().data(); }, rep, "cma");
    if (win->reachable_everywhere() != std::optional<bool>(!missing))
      rep.fail(missing ? "without process_vm_readv the ranks did not agree to stage"
                       : "the ranks did not agree they reach each other");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

// A rank that cannot read its peers' memory makes every rank stage, from the communicator's first
// single-copy collective on, with right results. Here the pids it reads name another process (a
// child of its own), as a peer's would from another PID namespace sharing /dev/shm: the probe
// word reads back wrong or not at all, never a wrong buffer.
TEST_P(PeerWindow, CmaWindowsARankThatCannotReadItsPeersMakesEveryRankStage) {
  auto res = run_ranks(GetParam(), [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    shm::Group g(*store, rank, w, small_slots(), std::chrono::seconds(60));
    pid_t other = -1;
    if (rank == w - 1) {
      other = ::fork();
      if (other == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // gone with the rank, however the rank ends
        ::pause();
        ::_exit(0);
      }
    }
    struct Reap {
      pid_t pid;
      ~Reap() {
        if (pid > 0) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, nullptr, 0);
        }
      }
    } reap{other};
    auto win = device::cma_windows([&g, other](int r) { return other > 0 ? other : g.pid_of(r); });
    std::vector<std::vector<float>> heap;
    run_window_collectives(g, *win, [&](size_t n) { heap.emplace_back(n); return heap.back().data(); }, rep,
                           "unreachable");
    if (win->reachable_everywhere() != std::optional<bool>(false))
      rep.fail("rank " + std::to_string(rank) + " did not learn that a rank cannot read its peers");
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

INSTANTIATE_TEST_SUITE_P(World, PeerWindow, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "w" + std::to_string(i.param); });

// A peer whose process cannot be read (here: no such process) is unreachable, and says why.
// Without process_vm_readv (qemu-user) every process is unreachable, with that reason.
TEST(PeerWindowCma, AProcessThatCannotBeReadIsUnreachableWithTheReason) {
  const bool missing = cma_missing_here();
  auto mine = device::cma_windows([](int) { return ::getpid(); });
  auto wrong = device::cma_windows([](int) { return 0x3fffffff; });  // above any pid_max
  std::vector<std::byte> buf(64), desc(device::PeerWindows::kDescriptorBytes);
  ASSERT_TRUE(mine->expose(buf.data(), buf.size(), desc.data()));
  std::string why;
  EXPECT_EQ(mine->reachable(1, desc.data(), &why), !missing) << why;
  if (missing) {
    EXPECT_NE(why.find("Function not implemented"), std::string::npos) << why;
  }
  EXPECT_FALSE(wrong->reachable(1, desc.data(), &why));
  EXPECT_NE(why.find(missing ? "local rank 1 (pid 1073741823): Function not implemented"
                             : "local rank 1 (pid 1073741823): No such process"),
            std::string::npos)
      << why;
  EXPECT_TRUE(mine->needs_probe());
}

// A read past what the peer exposed is refused with the sizes named, before any system call
// (so also where there is no process_vm_readv to make one).
TEST(PeerWindowCma, ReadPastTheExposedBytesIsRefused) {
  auto win = device::cma_windows([](int) { return ::getpid(); });
  std::vector<std::byte> buf(64), desc(device::PeerWindows::kDescriptorBytes), dst(128);
  ASSERT_TRUE(win->expose(buf.data(), buf.size(), desc.data()));
  const auto b = win->open(0, desc.data());
  OpInfo op = op_for("allgather", 0, 1);
  if (!cma_missing_here()) win->read(b, 32, dst.data(), 32, op);  // the last 32 bytes: fine
  try {
    win->read(b, 32, dst.data(), 33, op);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("read of 33 bytes at offset 32 past the 64 bytes"), std::string::npos)
        << e.what();
  }
}

// A mapped window (CUDA IPC's shape) refuses a read past what the peer exposed, as CMA does:
// an allgather whose ranks disagree on the count (the consistency check off) read another
// buffer's bytes of the peer's arena, or faulted past it. The rank with the larger count is
// refused, naming the sizes; its peer, which read less than it was given, then loses it.
TEST(PeerWindowMapped, ReadPastTheExposedBytesIsRefused) {
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    MappedWindows win(64 << 20);
    shm::Group g(*store, rank, w, small_slots(), std::chrono::seconds(20));
    algorithms::ScratchPool scratch;
    const size_t count = rank == 1 ? 2048 : 1024;
    float* in = win.alloc<float>(count);
    float* out = win.alloc<float>(count * 2);
    OpInfo op = op_for("allgather", rank, w);
    algorithms::Context ctx{g, device::host(), op, nullptr, nullptr, nullptr, &scratch, &win};
    CollArgs a;
    a.kind = CollKind::allgather, a.send = in, a.recv = out, a.count = count;
    if (rank == 1)
      expect_throw<InvalidArgument>(rep, "allgather of 2048 floats against 1024",
                                    [&] { algorithms::find(CollKind::allgather, "window").run(ctx, a); },
                                    "read of 8192 bytes at offset 0 past the 4096 bytes local rank 0 exposed");
    else
      try {
        algorithms::find(CollKind::allgather, "window").run(ctx, a);
        rep.fail("rank 0 finished the allgather although rank 1 failed in it");
      } catch (const PeerError&) {
      }
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

}  // namespace
}  // namespace smddp::testing
