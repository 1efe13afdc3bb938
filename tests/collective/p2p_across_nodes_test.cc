// Point-to-point with a rank on another node, where the network may still hold a failed
// operation's buffer: a receive that fails, or whose communicator is destroyed under it, is
// withdrawn from the network before the caller hears of it (and may free the buffer).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collective/harness.h"

namespace smddp::testing {
namespace {

#ifdef SMDDP_HAVE_LIBFABRIC  // across nodes needs the libfabric transport
// A receive from another node that fails because this node aborted withdraws itself from the
// network before its error reaches the caller, who may then free the buffer: rank 2's message,
// sent after rank 0's receive failed, must not land in it, even while the communicator's
// destruction drives the network. (The abort was checked before the transfer's poll, outside the
// part that cancels what it posted, so the receive stayed posted and took the message then.)
TEST(P2P, AReceiveAcrossNodesFailedByALocalAbortIsWithdrawn) {
  NetnsHosts hosts(2);
  auto res = run_ranks(3, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.timeout = std::chrono::seconds(20);
    std::vector<int32_t> buf(4, -7);  // outlives the communicator: its destruction drives the network too
    auto c_owner = std::make_unique<Communicator>(store, rank, w, o);
    Communicator& c = *c_owner;
    c.barrier().wait();
    const std::vector<uint8_t> yes{1};
    constexpr auto kWait = std::chrono::seconds(20);
    if (rank == 0) {
      Work r = c.recv(buf.data(), 4, DataType::i32, 2, 1);
      store->set("test/posted", yes);
      try {
        r.wait();
        rep.fail("the receive succeeded");
      } catch (const AbortedError&) {
      } catch (const Error& e) {
        rep.fail(std::string("not an AbortedError: ") + e.what());
      }
      store->set("test/failed", yes);
      store->get("test/sent", kWait);
      // Give the message time to land, driving the endpoint as later calls would.
      for (int i = 0; i < 20; ++i) {
        try {
          int32_t x = 0;
          c.recv(&x, 1, DataType::i32, 2, 9).wait();
        } catch (const Error&) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      c_owner.reset();
      if (buf != std::vector<int32_t>(4, -7)) rep.fail("a message landed in the failed receive's buffer");
    } else if (rank == 1) {
      store->get("test/posted", kWait);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0's receive is posted
      c.abort("the test aborts node 0");
    } else {
      store->get("test/failed", kWait);
      std::vector<int32_t> msg(4, 42);
      try {
        c.send(msg.data(), 4, DataType::i32, 0, 1).wait();
      } catch (const Error&) {  // it may hear of the abort first
      }
      store->set("test/sent", yes);
      std::this_thread::sleep_for(std::chrono::milliseconds(400));  // rank 0 looks meanwhile
    }
  }, hosts.place({0, 0, 1}));
  ASSERT_TRUE(res.ok()) << res.summary();
}

// A receive from a rank on another node, pending when its communicator is destroyed: the engine
// fails it unpolled, and it withdraws its transfer from the network as it goes, before the
// endpoint closes with the rest of the communicator. It stayed posted until that close (logged),
// so a message could still land in a buffer its owner had freed on hearing of the failure (a
// waiter on another thread), and over efa the NIC writes a posted buffer by itself.
TEST(P2PAcrossNodes, OpsPendingWhenTheirCommunicatorIsDestroyedAreWithdrawn) {
  NetnsHosts hosts(2);
  RunOptions ro = hosts.place({0, 1});
  ro.env.push_back({"SMDDP_DEBUG", "INFO"});  // the endpoint logs what its close discards
  auto res = run_ranks(2, [](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    // This rank's log goes to a file of its own, read once the communicator is gone.
    const std::string log = "/tmp/smddp-p2p-withdrawn-" + std::to_string(::getpid()) + ".log";
    const int saved = ::dup(2), fd = ::open(log.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (saved < 0 || fd < 0 || ::dup2(fd, 2) < 0) return rep.fail("cannot redirect stderr");
    ::close(fd);
    Options o;
    o.timeout = std::chrono::seconds(20);
    std::vector<int32_t> buf(1024, -7);
    {
      auto c = std::make_unique<Communicator>(store, rank, w, o);
      c->barrier().wait();
      if (rank == 0) {
        // Never sent to: rank 1 keeps its communicator, without sending, until this one is gone.
        Work r = c->recv(buf.data(), buf.size(), DataType::i32, 1, 1);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the engine posts it meanwhile
        c.reset();
        store->set("test/destroyed", {1});
        try {
          r.wait();
          rep.fail("the receive succeeded");
        } catch (const AbortedError&) {
        }
      } else {
        store->get("test/destroyed", std::chrono::seconds(20));
      }
    }
    ::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::ifstream f(log);
    std::stringstream text;
    text << f.rdbuf();
    ::unlink(log.c_str());
    if (text.str().find("libfabric ") == std::string::npos) rep.fail("no INFO log was written: the check saw nothing");
    const auto at = text.str().find("the endpoint closes with");
    if (at != std::string::npos)
      rep.fail("rank " + std::to_string(rank) + "'s " + text.str().substr(at, 80) + "...");
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}
#endif

}  // namespace
}  // namespace smddp::testing
