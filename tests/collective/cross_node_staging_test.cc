// CUDA memory in a communicator that spans nodes (core/host_staging.h), on machines without a
// GPU: the stand-in device's memory faults when the host or the network touches it
// (far_device.h), and its copies land late. Every collective, in place and out of place, two
// counts (one of several pipeline slices), the hierarchical and the direct algorithms, on 2
// pretend nodes over loopback, staged whole and in pieces (the larger count's allreduce,
// allgather and reduce_scatter): results equal a scalar reference, outputs a rank does not own
// keep their sentinels, and a collective that fails writes nothing. And device memory that the
// network reaches itself, which is not staged (CrossNodeDeviceMemory): the same collectives run
// on it, on its late device, across nodes; and with SMDDP_CUDA_NET_BOUNCE the same on memory the
// network does not reach, its messages bounced through host buffers (CrossNodeBounce).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "algorithms/net_exchange.h"
#include "collective/far_device.h"
#include "collective/harness.h"
#include "device/cuda.h"
#include "smddp/communicator.h"

namespace smddp::testing {
namespace {

using namespace std::chrono_literals;

// Integer-valued floats: sums are exact in any order.
float value(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 13)); }
constexpr float kSentinel = -7.0f;

struct Layout {
  int hosts, per_host;
  const char* piece;  // SMDDP_CUDA_STAGING_PIECE: 64k cuts the 70 001-element calls into 5-18 pieces
};

RunOptions pretend_nodes(const Layout& l) {
  RunOptions ro;
  ro.env = {{"FI_TCP_IFACE", "lo"},
            {"SMDDP_OFI_REGISTER", "always"},
            {"SMDDP_HIER_SLICE", "256k"},
            {"SMDDP_CUDA_STAGING_PIECE", l.piece}};
  for (int h = 0; h < l.hosts; ++h)
    for (int i = 0; i < l.per_host; ++i) ro.rank_env.push_back({{"SMDDP_NODE_ID", "host" + std::to_string(h)}});
  return ro;
}

// Checks `n` elements of a device buffer against want(i) through the host's view.
template <class Want>
void check(const FarMemory& mem, const float* dev, size_t n, const std::string& what, Report& rep, Want want) {
  const float* h = mem.host(dev);
  for (size_t i = 0; i < n; ++i)
    if (h[i] != want(i)) {
      rep.fail(what + ": element " + std::to_string(i) + " is " + std::to_string(h[i]) + ", expected " +
               std::to_string(want(i)));
      return;
    }
}

// Every collective on stand-in device memory through `c`, `n` elements a block.
void every_collective(Communicator& c, FarMemory& mem, size_t n, const std::string& label, Report& rep) {
  const int rank = c.rank(), w = c.size();
  const size_t W = static_cast<size_t>(w);
  const Memory gpu = Memory::cuda(0);
  auto buffer = [&](size_t count, auto fill) {
    float* d = mem.alloc<float>(count);
    float* h = mem.host(d);
    for (size_t i = 0; i < count; ++i) h[i] = fill(i);
    return d;
  };
  auto mine = [&](size_t i) { return value(rank, i); };
  auto sentinel = [](size_t) { return kSentinel; };
  auto sum = [&](size_t i) {
    float s = 0;
    for (int r = 0; r < w; ++r) s += value(r, i);
    return s;
  };
  const std::string at = label + " n=" + std::to_string(n) + " ";

  float* s = buffer(n, mine);
  float* r = buffer(n, sentinel);
  c.allreduce(s, r, n, DataType::f32, ReduceOp::sum, gpu).wait();
  check(mem, r, n, at + "allreduce", rep, sum);
  check(mem, s, n, at + "allreduce's input", rep, mine);  // an input is never written
  c.allreduce(s, s, n, DataType::f32, ReduceOp::max, gpu).wait();
  check(mem, s, n, at + "allreduce in place (max)", rep, [&](size_t i) { return value(w - 1, i); });

  float* parts = buffer(n + 3, mine);
  c.allreduce_coalesced(parts, parts, {3, n}, DataType::f32, ReduceOp::sum, gpu).wait();
  check(mem, parts, n + 3, at + "allreduce_coalesced in place", rep, sum);

  float* g = buffer(n * W, sentinel);
  c.allgather(s = buffer(n, mine), g, n, DataType::f32, gpu).wait();
  check(mem, g, n * W, at + "allgather", rep, [&](size_t i) { return value(static_cast<int>(i / n), i % n); });
  g = buffer(n * W, [&](size_t i) { return i / n == static_cast<size_t>(rank) ? value(rank, i % n) : kSentinel; });
  c.allgather(g + static_cast<size_t>(rank) * n, g, n, DataType::f32, gpu).wait();  // torch's in place
  check(mem, g, n * W, at + "allgather in place", rep, [&](size_t i) { return value(static_cast<int>(i / n), i % n); });

  float* big = buffer(n * W, mine);
  r = buffer(n, sentinel);
  c.reduce_scatter(big, r, n, DataType::f32, ReduceOp::sum, gpu).wait();
  check(mem, r, n, at + "reduce_scatter", rep, [&](size_t i) { return sum(static_cast<size_t>(rank) * n + i); });
  big = buffer(n * W, mine);
  c.reduce_scatter(big, big + static_cast<size_t>(rank) * n, n, DataType::f32, ReduceOp::sum, gpu).wait();
  check(mem, big + static_cast<size_t>(rank) * n, n, at + "reduce_scatter in place", rep,
        [&](size_t i) { return sum(static_cast<size_t>(rank) * n + i); });

  const int root = w - 1;
  float* b = buffer(n, [&](size_t i) { return rank == root ? value(root, i) : kSentinel; });
  c.broadcast(b, n, DataType::f32, root, gpu).wait();
  check(mem, b, n, at + "broadcast", rep, [&](size_t i) { return value(root, i); });

  s = buffer(n, mine);
  r = buffer(n, sentinel);
  c.reduce(s, r, n, DataType::f32, ReduceOp::sum, 1, gpu).wait();
  if (rank == 1) check(mem, r, n, at + "reduce (root)", rep, sum);
  else check(mem, r, n, at + "reduce's recv off the root", rep, sentinel);

  g = buffer(n * W, sentinel);
  c.gather(s, g, n, DataType::f32, 2 % w, gpu).wait();
  if (rank == 2 % w) check(mem, g, n * W, at + "gather", rep, [&](size_t i) { return value(static_cast<int>(i / n), i % n); });
  else check(mem, g, n * W, at + "gather's recv off the root", rep, sentinel);

  big = buffer(n * W, [&](size_t i) { return rank == 0 ? value(static_cast<int>(i / n), i % n) : kSentinel; });
  r = buffer(n, sentinel);
  c.scatter(big, r, n, DataType::f32, 0, gpu).wait();
  check(mem, r, n, at + "scatter", rep, mine);

  // alltoallv with a gap of one element after each received block: the gaps keep the caller's
  // bytes (the whole extent goes back to the device).
  std::vector<size_t> counts(W, n), sdispl(W), rdispl(W);
  for (size_t j = 0; j < W; ++j) {
    sdispl[j] = j * n;
    rdispl[j] = j * (n + 1);
  }
  big = buffer(n * W, [&](size_t i) { return value(rank, i) + static_cast<float>(1000 * (i / n)); });
  r = buffer((n + 1) * W, sentinel);
  c.alltoallv(big, counts, sdispl, r, counts, rdispl, DataType::f32, gpu).wait();
  check(mem, r, (n + 1) * W, at + "alltoallv with gaps", rep, [&](size_t i) {
    const size_t from = i / (n + 1), k = i % (n + 1);
    return k == n ? kSentinel : value(static_cast<int>(from), static_cast<size_t>(rank) * n + k) + 1000.0f * rank;
  });
  c.barrier().wait();
  mem.reset();
}

// An allreduce of `n` elements on device memory that the ranks disagree about: every rank gets
// a MismatchError saying `why`, and its output keeps its sentinels (nothing was copied back).
void mismatched_allreduce(Communicator& c, FarMemory& mem, size_t n, const std::string& what, const char* why,
                          Report& rep) {
  float* s = mem.alloc<float>(n);
  float* r = mem.alloc<float>(n);
  for (size_t i = 0; i < n; ++i) {
    mem.host(s)[i] = value(c.rank(), i);
    mem.host(r)[i] = kSentinel;
  }
  expect_throw<MismatchError>(
      rep, what, [&] { c.allreduce(s, r, n, DataType::f32, ReduceOp::sum, Memory::cuda(0)).wait(); }, why);
  check(mem, r, n, "the failed allreduce's output", rep, [](size_t) { return kSentinel; });
}

// every_collective at two counts with each cross-node algorithm (hier_small: the small
// allreduce's), then an allreduce the ranks disagree about: it copies nothing back (the output
// keeps its sentinels on every rank), and every rank gets the error.
void every_algorithm_then_a_mismatch(std::shared_ptr<Store> store, int rank, int w, FarMemory& mem, Report& rep) {
  for (const char* algos : {"allreduce:hier,allgather:hier,reduce_scatter:hier",
                            "allreduce:net_direct,allgather:net_direct,reduce_scatter:net_direct",
                            "allreduce:hier_small"}) {
    Options o;
    o.timeout = 120s;
    o.algorithms = algos;
    Communicator c(store, rank, w, o);
    for (size_t n : {size_t{5}, size_t{70001}}) every_collective(c, mem, n, algos, rep);
  }
  Options o;
  o.timeout = 60s;
  o.name = "mismatch";
  Communicator c(store, rank, w, o);
  mismatched_allreduce(c, mem, 64 + (rank == 0 ? 1 : 0), "allreduce of 65 against 64 elements",
                       "ranks called different collectives", rep);
}

class CrossNodeStaging : public ::testing::TestWithParam<Layout> {};

TEST_P(CrossNodeStaging, EveryCollectiveOnDeviceMemoryMatchesTheReference) {
  const Layout l = GetParam();
  auto res = run_ranks(l.hosts * l.per_host, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    FarMemory mem(size_t{96} << 20);
    FarDeviceStandIn stand_in(mem);
    every_algorithm_then_a_mismatch(store, rank, w, mem, rep);
    if (mem.device_reductions() != 0)
      rep.fail(std::to_string(mem.device_reductions()) + " reductions ran on the device, which stages");
  }, pretend_nodes(l));
  ASSERT_TRUE(res.ok()) << res.summary();
}

// Ranks whose SMDDP_CUDA_STAGING_PIECE differs would cut one collective differently: the
// fingerprint says so before any piece runs, and nothing is written.
// Every algorithm step wraps below the fingerprint exchange's 0xFFE and the ready token's 0xFFF:
// step 4094 (a hierarchical reduce_scatter's slice 4094, 16 GiB at 4 MiB slices) had 0xFFE.
TEST(NetExchangeTags, NoAlgorithmStepSharesTheFingerprintExchangesField) {
  using smddp::algorithms::NetExchange;
  EXPECT_EQ(NetExchange::step_field(NetExchange::kAgreementStep), 0xFFEu);
  for (uint32_t step : {0u, 1u, 4093u, 4094u, 4095u, 8188u, 0x7FFFFFFFu, 0xFFFFFFFEu}) {
    EXPECT_LT(NetExchange::step_field(step), 0xFFEu) << "step " << step;
  }
  EXPECT_EQ(NetExchange::step_field(4094), NetExchange::step_field(0));  // wraps
}

// 2x2 pretend nodes whose rank 3 has the setting `name`=`value` of its own: an allreduce of `n`
// elements on stand-in device memory fails on every rank saying `why`, and writes nothing.
void rank_3_disagrees(RunOptions ro, const char* name, const char* value, size_t n, const char* what,
                      const char* why) {
  ro.rank_env[3].push_back({name, value});
  auto res = run_ranks(4, [&](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    FarMemory mem(size_t{8} << 20);
    FarDeviceStandIn stand_in(mem);
    Options o;
    o.timeout = 60s;
    Communicator c(store, rank, w, o);
    mismatched_allreduce(c, mem, n, what, why, rep);
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

TEST(CrossNodeStagingPieces, RanksThatCutACollectiveDifferentlyDisagree) {
  rank_3_disagrees(pretend_nodes(Layout{2, 2, "64k"}), "SMDDP_CUDA_STAGING_PIECE", "128k", 70001,
                   "allreduce cut into 64 KiB and 128 KiB pieces", "staged in pieces of");
}

// Device memory that the network reaches itself (FI_HMEM, GPUDirect) is not staged: the
// algorithms run on it across nodes with its device, whose work lands late, so every network post
// must fence first (NetExchange): a send of a shard whose reduction is still queued carries stale
// bytes, a receive into scratch that an earlier slice's queued reduction still reads corrupts it.
// Not staged shows as reductions on the device (a staged collective reduces its host copies).
class CrossNodeDeviceMemory : public ::testing::TestWithParam<Layout> {};

TEST_P(CrossNodeDeviceMemory, TheNetworkReadsWhatTheDeviceWroteAndNothingIsStaged) {
  const Layout l = GetParam();
  auto res = run_ranks(l.hosts * l.per_host, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    FarMemory mem(size_t{96} << 20, FarMemory::Reach::network);
    FarDeviceStandIn stand_in(mem);
    every_algorithm_then_a_mismatch(store, rank, w, mem, rep);
    if (mem.device_reductions() == 0) rep.fail("no reduction ran on the device: the collectives were staged");
  }, pretend_nodes(l));
  ASSERT_TRUE(res.ok()) << res.summary();
}

INSTANTIATE_TEST_SUITE_P(Layouts, CrossNodeDeviceMemory,
                         ::testing::Values(Layout{2, 2, "64k"}, Layout{3, 1, "64k"}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return std::to_string(i.param.hosts) + "x" + std::to_string(i.param.per_host);
                         });

// SMDDP_CUDA_NET_BOUNCE=1: on device memory that neither the host nor the network reaches, the
// collectives run on the device (its reductions, its copies) and only their messages between
// nodes pass through host buffers (algorithms/bounce_pool.h). A message posted from or into
// device memory itself fails (the sockets cannot touch the PROT_NONE view); a send posted before
// its bounce copy landed, or a receive's bounce copied out before it arrived, gives stale bytes
// (the device's copies land 300 us late). Not staged shows as reductions on the device.
RunOptions bouncing(const Layout& l) {
  RunOptions ro = pretend_nodes(l);
  ro.env.push_back({"SMDDP_CUDA_NET_BOUNCE", "1"});
  return ro;
}

class CrossNodeBounce : public ::testing::TestWithParam<Layout> {};

TEST_P(CrossNodeBounce, TheCollectivesRunOnTheDeviceAndOnlyTheirMessagesPassThroughTheHost) {
  const Layout l = GetParam();
  auto res = run_ranks(l.hosts * l.per_host, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    FarMemory mem(size_t{96} << 20);
    FarDeviceStandIn stand_in(mem);
    every_algorithm_then_a_mismatch(store, rank, w, mem, rep);
    if (mem.device_reductions() == 0) rep.fail("no reduction ran on the device: the collectives were staged");
  }, bouncing(l));
  ASSERT_TRUE(res.ok()) << res.summary();
}

INSTANTIATE_TEST_SUITE_P(Layouts, CrossNodeBounce, ::testing::Values(Layout{2, 2, "64k"}, Layout{3, 1, "64k"}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return std::to_string(i.param.hosts) + "x" + std::to_string(i.param.per_host);
                         });

// A rank that stages while its node-mate bounces would expose host copies where the other opens
// device memory: the fingerprint says so before anything moves, and nothing is written.
TEST(CrossNodeBounceSetting, RanksThatBounceAndRanksThatStageDisagree) {
  rank_3_disagrees(bouncing(Layout{2, 2, "64k"}), "SMDDP_CUDA_NET_BOUNCE", "0", 1000,
                   "allreduce bounced on three ranks, staged on one", "SMDDP_CUDA_NET_BOUNCE");
}

// A rank that dies between pieces (killed as it queues its fifth device copy: piece 0 done and
// copied out, piece 1's copy in queued) is named on every other rank within the timeout, on its
// node and the other; nothing hangs, and nothing crashes while the survivors' queued copies drain.
TEST(CrossNodeStagingPieces, ARankKilledBetweenPiecesIsNamedEverywhere) {
  auto res = run_ranks(4, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    FarMemory mem(size_t{8} << 20);
    int copies = 0;
    FarDeviceStandIn stand_in(mem, [&] {
      if (rank == 3 && ++copies == 5) ::kill(::getpid(), SIGKILL);
    });
    Options o;
    o.timeout = 20s;  // detection must come well before this
    Communicator c(store, rank, w, o);
    const size_t n = 70001;  // 5 pieces of 64 KiB
    float* v = mem.alloc<float>(n);
    for (size_t i = 0; i < n; ++i) mem.host(v)[i] = value(rank, i);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.allreduce(v, v, n, DataType::f32, ReduceOp::sum, Memory::cuda(0)).wait();
      rep.fail("the allreduce succeeded although rank 3 died in it");
    } catch (const Error& e) {
      if (std::string(e.what()).find("rank 3") == std::string::npos)
        rep.fail("the error does not name the lost rank 3: " + std::string(e.what()));
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    if (took > 15s) rep.fail("took " + std::to_string(took.count() / 1000000) + " ms");
  }, pretend_nodes(Layout{2, 2, "64k"}));
  ASSERT_EQ(res.ranks[3].exit_code, -SIGKILL) << res.summary();
  res.ranks[3].exit_code = 0;
  ASSERT_TRUE(res.ok()) << res.summary();
}

INSTANTIATE_TEST_SUITE_P(Layouts, CrossNodeStaging,
                         ::testing::Values(Layout{2, 2, "64k"}, Layout{2, 2, "0"}, Layout{2, 1, "64k"},
                                           Layout{3, 1, "64k"}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           return std::to_string(i.param.hosts) + "x" + std::to_string(i.param.per_host) +
                                  (std::string(i.param.piece) == "0" ? "_whole" : "_pieces");
                         });

}  // namespace
}  // namespace smddp::testing
