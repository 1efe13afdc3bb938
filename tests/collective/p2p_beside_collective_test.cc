// A collective and the sends and receives around it, between the same ranks, each waiting for
// the other to progress: the engine runs the collective beside the sends and receives in flight,
// issued before it or while it runs (or is queued), and polls them from its waits, as gloo and
// NCCL let them progress independently. Engine-level tests: engine_p2p_beside_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "collective/harness.h"

namespace smddp::testing {
namespace {

// The message the sender wrote, an iota from `first`: the first element that differs fails `rep`.
void check_message(Report& rep, const std::string& what, const std::vector<int32_t>& msg, int first) {
  for (size_t i = 0; i < msg.size(); ++i)
    if (msg[i] != static_cast<int32_t>(first + i)) {
      rep.fail(what + "element " + std::to_string(i) + " is " + std::to_string(msg[i]));
      return;
    }
}

// A collective issued while this rank's send or receive is still in flight runs beside it, as
// with gloo and NCCL: it used to wait for the p2p op to finish, which waits for a peer that sends
// or receives only after that very collective (a pipeline stage's pending irecv, then an
// allreduce on the same group), so both ranks hung until the timeout (found by review). Three
// ways between ranks 0 and 1, each with a small message and one larger than the FIFO (which only
// polls from inside the collective's waits move); any other rank only joins the collectives:
//   0: rank 0's receive pending, its peer sends after the collective;
//   1: rank 0's receive pending, its peer's send blocks before the collective;
//   2: rank 0's send pending, its peer's receive blocks before the collective.
// `large` elements for the large message; `within`, when set, bounds how long rank 0's
// collective and op take together in patterns 1 and 2 (what the polls from its waits cost).
void collective_beside_pending_p2p(int world, const RunOptions& ro, size_t large, std::chrono::milliseconds within) {
  auto res = run_ranks(world, [large, within](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.timeout = std::chrono::seconds(20);
    Communicator c(store, rank, w, o);
    for (int pattern = 0; pattern < 3; ++pattern)
      for (size_t n : {size_t{16}, large}) {
        const std::string what = "pattern " + std::to_string(pattern) + ", " + std::to_string(n) + " elements: ";
        std::vector<int32_t> msg(rank < 2 ? n : 0);
        const bool sender = (pattern == 2) == (rank == 0);
        if (sender) std::iota(msg.begin(), msg.end(), 5 + pattern);
        int32_t x = rank + 1;
        const auto t0 = std::chrono::steady_clock::now();
        try {
          if (rank == 0) {
            Work p = pattern == 2 ? c.send(msg.data(), n, DataType::i32, 1, 3) : c.recv(msg.data(), n, DataType::i32, 1, 3);
            c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum).wait();
            p.wait();
          } else if (rank == 1 && pattern == 0) {
            c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum).wait();
            c.send(msg.data(), n, DataType::i32, 0, 3).wait();
          } else if (rank == 1) {
            if (pattern == 1) c.send(msg.data(), n, DataType::i32, 0, 3).wait();
            else c.recv(msg.data(), n, DataType::i32, 0, 3).wait();
            c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum).wait();
          } else {
            c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum).wait();
          }
        } catch (const Error& e) {
          rep.fail(what + e.what());
          return;
        }
        const auto took = std::chrono::steady_clock::now() - t0;
        if (x != w * (w + 1) / 2) rep.fail(what + "the allreduce gave " + std::to_string(x));
        if (rank < 2 && !sender) check_message(rep, what, msg, 5 + pattern);
        if (rank == 0 && pattern > 0 && n == large && within.count() > 0 && took > within)
          rep.fail(what + "took " +
                   std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
                   " ms, more than " + std::to_string(within.count()));
        c.barrier().wait();
      }
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

TEST(P2P, ACollectiveRunsBesideASendOrReceiveInFlight) {
  collective_beside_pending_p2p(2, {}, size_t{3} << 20, std::chrono::milliseconds(0));
}

// The other way round: rank 0 issues one or two collectives without waiting (async_op=True in
// torch; the engine thread runs them), then a send or receive whose peer takes part in those
// collectives only after it. The send or receive used to wait for the collectives, which waited
// for the peer: both ranks hung until the timeout. gloo and NCCL start it at once. Patterns:
//   0: rank 0 sends; rank 1's receive blocks before its collectives;
//   1: rank 0 receives; rank 1's send (larger than the FIFO for `large`) blocks before them;
//   2: as 0, with two collectives queued ahead of the send.
// Inline execution is off (as in the PyTorch backend): an inline collective runs before its
// call returns, so no send after it could be issued in time.
void p2p_after_unwaited_collectives(int world, RunOptions ro, size_t large, std::chrono::milliseconds within) {
  auto res = run_ranks(world, [large, within](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    Options o;
    o.timeout = std::chrono::seconds(20);
    o.inline_execution = false;
    Communicator c(store, rank, w, o);
    for (int pattern = 0; pattern < 3; ++pattern)
      for (size_t n : {size_t{16}, large}) {
        const std::string what = "pattern " + std::to_string(pattern) + ", " + std::to_string(n) + " elements: ";
        const int collectives = pattern == 2 ? 2 : 1;
        std::vector<int32_t> msg(rank < 2 ? n : 0);
        const bool sender = (pattern == 1) == (rank == 1);
        if (sender) std::iota(msg.begin(), msg.end(), 7 + pattern);
        std::vector<int32_t> x(2, rank + 1);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          if (rank == 0) {
            std::vector<Work> coll;
            for (int i = 0; i < collectives; ++i)
              coll.push_back(c.allreduce(&x[i], &x[i], 1, DataType::i32, ReduceOp::sum));
            Work p = pattern == 1 ? c.recv(msg.data(), n, DataType::i32, 1, 5) : c.send(msg.data(), n, DataType::i32, 1, 5);
            p.wait();
            for (auto& a : coll) a.wait();
          } else {
            if (rank == 1 && pattern == 1) c.send(msg.data(), n, DataType::i32, 0, 5).wait();
            if (rank == 1 && pattern != 1) c.recv(msg.data(), n, DataType::i32, 0, 5).wait();
            for (int i = 0; i < collectives; ++i) c.allreduce(&x[i], &x[i], 1, DataType::i32, ReduceOp::sum).wait();
          }
        } catch (const Error& e) {
          rep.fail(what + e.what());
          return;
        }
        const auto took = std::chrono::steady_clock::now() - t0;
        for (int i = 0; i < collectives; ++i)
          if (x[i] != w * (w + 1) / 2) rep.fail(what + "allreduce " + std::to_string(i) + " gave " + std::to_string(x[i]));
        if (rank < 2 && !sender) check_message(rep, what, msg, 7 + pattern);
        if (rank == 0 && within.count() > 0 && took > within)
          rep.fail(what + "took " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
                   " ms, more than " + std::to_string(within.count()));
        c.barrier().wait();
      }
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

TEST(P2P, ASendOrReceiveIssuedAfterUnwaitedCollectivesDoesNotWaitForThem) {
  p2p_after_unwaited_collectives(2, {}, size_t{3} << 20, std::chrono::milliseconds(2500));
  p2p_after_unwaited_collectives(3, {}, size_t{3} << 20, std::chrono::milliseconds(2500));
}

// A synchronous collective on one thread (run on that thread: inline execution, or its wait
// running it, as torch's synchronous calls do) while another thread of the process sends or
// receives on the same communicator, whose peer takes part in the collective only after it: the
// send or receive starts from the collective's waits. It used to wait for the collective, which
// waited for the peer: both ranks hung until the timeout (gloo starts it at once). The second
// thread issues its op 50 ms after the collective began, so that it finds it running.
//   pattern 0: rank 0's second thread sends; rank 1 receives, then joins the collective;
//   pattern 1: rank 0's second thread receives; rank 1 sends (larger than the FIFO for `large`).
void p2p_from_another_thread_beside_a_synchronous_collective(int world, RunOptions ro, size_t large) {
  auto res = run_ranks(world, [large](int rank, int w, std::shared_ptr<Store> store, Report& rep) {
    for (const bool inline_execution : {true, false}) {
      Options o;
      o.timeout = std::chrono::seconds(20);
      o.inline_execution = inline_execution;
      Communicator c(store, rank, w, o);
      for (int pattern = 0; pattern < 2; ++pattern)
        for (size_t n : {size_t{16}, large}) {
          const std::string what = std::string(inline_execution ? "inline" : "run by its wait") + ", pattern " +
                                   std::to_string(pattern) + ", " + std::to_string(n) + " elements: ";
          std::vector<int32_t> msg(rank < 2 ? n : 0);
          const bool sender = (pattern == 0) == (rank == 0);
          if (sender) std::iota(msg.begin(), msg.end(), 3 + pattern);
          int32_t x = rank + 1;
          try {
            if (rank == 0) {
              std::string other_error;
              std::thread other([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                try {
                  if (pattern == 0) c.send(msg.data(), n, DataType::i32, 1, 9).wait();
                  else c.recv(msg.data(), n, DataType::i32, 1, 9).wait();
                } catch (const Error& e) {
                  other_error = e.what();
                }
              });
              try {
                c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum).wait();
              } catch (...) {
                other.join();
                throw;
              }
              other.join();
              if (!other_error.empty()) rep.fail(what + "the other thread's op: " + other_error);
            } else if (rank == 1) {
              if (pattern == 0) c.recv(msg.data(), n, DataType::i32, 0, 9).wait();
              else c.send(msg.data(), n, DataType::i32, 0, 9).wait();
              c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum).wait();
            } else {
              c.allreduce(&x, &x, 1, DataType::i32, ReduceOp::sum).wait();
            }
          } catch (const Error& e) {
            rep.fail(what + e.what());
            return;
          }
          if (x != w * (w + 1) / 2) rep.fail(what + "the allreduce gave " + std::to_string(x));
          if (rank < 2 && !sender) check_message(rep, what, msg, 3 + pattern);
          c.barrier().wait();
        }
    }
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

TEST(P2P, ASendOrReceiveFromAnotherThreadStartsBesideASynchronousCollective) {
  p2p_from_another_thread_beside_a_synchronous_collective(2, {}, size_t{3} << 20);
  p2p_from_another_thread_beside_a_synchronous_collective(3, {}, size_t{3} << 20);
}

#ifdef SMDDP_HAVE_LIBFABRIC  // across nodes needs the libfabric transport
TEST(P2P, ACollectiveRunsBesideASendOrReceiveInFlightAcrossNodes) {
  NetnsHosts hosts(2);
  collective_beside_pending_p2p(2, hosts.place({0, 1}), size_t{3} << 20, std::chrono::milliseconds(0));
  // Without the consistency check, whose first round would wait inside the node instead.
  RunOptions ro = hosts.place({0, 0, 1});
  ro.env.push_back({"SMDDP_CHECK_CONSISTENCY", "0"});
  collective_beside_pending_p2p(3, ro, size_t{16} << 20, std::chrono::milliseconds(2500));
}

TEST(P2P, ASendOrReceiveIssuedAfterUnwaitedCollectivesAcrossNodesDoesNotWaitForThem) {
  NetnsHosts hosts(2);
  p2p_after_unwaited_collectives(2, hosts.place({0, 1}), size_t{3} << 20, std::chrono::milliseconds(2500));
  RunOptions ro = hosts.place({0, 0, 1});
  ro.env.push_back({"SMDDP_CHECK_CONSISTENCY", "0"});
  p2p_after_unwaited_collectives(3, ro, size_t{3} << 20, std::chrono::milliseconds(2500));
}

TEST(P2P, ASendOrReceiveFromAnotherThreadStartsBesideASynchronousCollectiveAcrossNodes) {
  NetnsHosts hosts(2);
  p2p_from_another_thread_beside_a_synchronous_collective(2, hosts.place({0, 1}), size_t{3} << 20);
  RunOptions ro = hosts.place({0, 0, 1});
  ro.env.push_back({"SMDDP_CHECK_CONSISTENCY", "0"});
  p2p_from_another_thread_beside_a_synchronous_collective(3, ro, size_t{3} << 20);
}
#endif

}  // namespace
}  // namespace smddp::testing
