// Point-to-point on CUDA memory (core/p2p_staging.h), on machines without a GPU: the stand-in
// device's memory faults when the host, a FIFO copy or the network touches it (far_device.h), and
// its copies land late, so a message that skipped its staging copy or its fence fails here. Within
// a node and, where libfabric is built, across pretend nodes over loopback: a ring of sends and
// receives posted together (sizes past the FIFO's), either side on host or device memory,
// receives from any rank, and a receive that fails leaving its buffer untouched.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "collective/far_device.h"
#include "collective/harness.h"
#include "device/cuda.h"
#include "smddp/communicator.h"

namespace smddp::testing {
namespace {

using namespace std::chrono_literals;

constexpr float kSentinel = -7.0f;
float value(int rank, size_t i) { return static_cast<float>(rank * 100000 + static_cast<int>(i % 99991)); }

struct Layout {
  int hosts, per_host;
};

RunOptions layout_options(const Layout& l) {
  RunOptions ro;
  if (l.hosts > 1) {
    ro.env = {{"FI_TCP_IFACE", "lo"}};
    for (int h = 0; h < l.hosts; ++h)
      for (int i = 0; i < l.per_host; ++i) ro.rank_env.push_back({{"SMDDP_NODE_ID", "host" + std::to_string(h)}});
  }
  return ro;
}

// The first `n` elements of `got` (host memory, or a device buffer read through the host's view)
// against want(i).
template <class Want>
void check(const float* got, size_t n, const std::string& what, Report& rep, Want want) {
  for (size_t i = 0; i < n; ++i)
    if (got[i] != want(i)) {
      rep.fail(what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
               std::to_string(want(i)));
      return;
    }
}

class DeviceP2P : public ::testing::TestWithParam<Layout> {};

TEST_P(DeviceP2P, MessagesOnDeviceMemoryArriveWhole) {
  const Layout l = GetParam();
  auto res = run_ranks(l.hosts * l.per_host, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    FarMemory mem(size_t{64} << 20);
    FarDeviceStandIn stand_in(mem);
    Options o;
    o.timeout = 120s;
    Communicator c(store, rank, w, o);
    const Memory gpu = Memory::cuda(0);
    const int next = (rank + 1) % w, prev = (rank + w - 1) % w;
    auto device_buffer = [&](size_t count, auto fill) {
      float* d = mem.alloc<float>(count);
      float* h = mem.host(d);
      for (size_t i = 0; i < count; ++i) h[i] = fill(i);
      return d;
    };
    auto mine = [&](size_t i) { return value(rank, i); };
    auto from_prev = [&](size_t i) { return value(prev, i); };

    // A ring, device to device, every send and receive posted before any is waited for: past
    // the FIFO's size (3 MiB) only progress of both at once finishes it. One element past each
    // receive keeps its sentinel.
    for (size_t n : {size_t{0}, size_t{5}, size_t{70001}, size_t{3} << 20 >> 2}) {
      const std::string at = "n=" + std::to_string(n) + " ";
      float* out = device_buffer(n, mine);
      float* in = device_buffer(n + 1, [](size_t) { return kSentinel; });
      Work s = c.send(out, n, DataType::f32, next, 3, gpu);
      Work r = c.recv(in, n, DataType::f32, prev, 3, gpu);
      s.wait();
      r.wait();
      check(mem.host(in), n, at + "received", rep, from_prev);
      check(mem.host(in) + n, 1, at + "past the message", rep, [](size_t) { return kSentinel; });
      check(mem.host(out), n, at + "the sent buffer", rep, mine);
      mem.reset();
    }

    // The wire carries host bytes: either side may be on host or device memory, whatever the
    // other's is. Odd ranks send from host memory and receive into device memory, even ranks the
    // other way round (with an odd w, one pair has both on the same kind).
    {
      const size_t n = 300001;
      const bool odd = rank % 2 == 1;
      std::vector<float> host_out(n), host_in(n, kSentinel);
      for (size_t i = 0; i < n; ++i) host_out[i] = mine(i);
      float* dev_out = device_buffer(n, mine);
      float* dev_in = device_buffer(n, [](size_t) { return kSentinel; });
      Work s = odd ? c.send(host_out.data(), n, DataType::f32, next, 4)
                   : c.send(dev_out, n, DataType::f32, next, 4, gpu);
      Work r = odd ? c.recv(dev_in, n, DataType::f32, prev, 4, gpu) : c.recv(host_in.data(), n, DataType::f32, prev, 4);
      s.wait();
      r.wait();
      check(odd ? mem.host(dev_in) : host_in.data(), n, "host and device mixed", rep, from_prev);
      mem.reset();
    }

    // Receives from any rank, on device memory: rank 0 takes one message from every other rank,
    // in whatever order they come, and knows each one's sender.
    if (rank == 0) {
      std::set<int> seen;
      for (int k = 1; k < w; ++k) {
        float* in = device_buffer(17, [](size_t) { return kSentinel; });
        Work r = c.recv_any(in, 17, DataType::f32, 5, gpu);
        r.wait();
        const int from = r.source();
        if (from < 1 || from >= w || !seen.insert(from).second) {
          rep.fail("recv_any on device memory: source " + std::to_string(from));
          continue;
        }
        check(mem.host(in), 17, "recv_any from rank " + std::to_string(from), rep,
              [from](size_t i) { return value(from, i); });
      }
    } else {
      c.send(device_buffer(17, mine), 17, DataType::f32, 0, 5, gpu).wait();
    }
    mem.reset();

    // Host collectives still run between them.
    int32_t x = 1;
    c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum).wait();
    if (x != w) rep.fail("allreduce after the messages gave " + std::to_string(x));
  }, layout_options(l));
  ASSERT_TRUE(res.ok()) << res.summary();
}

// A receive whose message does not match (another size) fails with the sizes named, and its
// device buffer keeps what it held: nothing is copied in from a message that was not taken.
TEST(DeviceP2PFailure, AMismatchedReceiveWritesNothing) {
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    FarMemory mem(size_t{1} << 20);
    FarDeviceStandIn stand_in(mem);
    Options o;
    o.timeout = 30s;
    Communicator c(store, rank, w, o);
    float* buf = mem.alloc<float>(65);
    for (size_t i = 0; i < 65; ++i) mem.host(buf)[i] = rank == 0 ? value(0, i) : kSentinel;
    if (rank == 0) {
      try {
        c.send(buf, 64, DataType::f32, 1, 9, Memory::cuda(0)).wait();
      } catch (const Error&) {  // the receiver's failure aborts the communicator: either outcome
      }
    } else {
      expect_throw<InvalidArgument>(rep, "a receive of 65 floats against a message of 64",
                                    [&] { c.recv(buf, 65, DataType::f32, 0, 9, Memory::cuda(0)).wait(); },
                                    "expected a message of 260 bytes with tag 9 from rank 0, but the next one has 256 bytes");
      check(mem.host(buf), 65, "the failed receive's buffer", rep, [](size_t) { return kSentinel; });
    }
  });
  ASSERT_TRUE(res.ok()) << res.summary();
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& i) {
  return std::to_string(i.param.hosts) + "x" + std::to_string(i.param.per_host);
}
INSTANTIATE_TEST_SUITE_P(OneNode, DeviceP2P, ::testing::Values(Layout{1, 2}, Layout{1, 3}), layout_name);
#ifdef SMDDP_HAVE_LIBFABRIC
INSTANTIATE_TEST_SUITE_P(PretendNodes, DeviceP2P, ::testing::Values(Layout{2, 1}, Layout{2, 2}), layout_name);
#endif

}  // namespace
}  // namespace smddp::testing
