// The per-communicator key of the libfabric transport (src/transport/ofi/job_key.h,
// docs/security.md): processes outside a communicator that reach its endpoints (a second job
// handed its addresses, a stale rank of a finished job whose port was reused) send under the
// very tags its ranks receive under, and none of their bytes reach a buffer of its; their
// messages are dropped and counted. On loopback, over tcp;ofi_rxm and over the provider smddp
// picks by default (libfabric 2.x: the native tcp; 1.17: tcp;ofi_rxm again).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "collective/harness.h"
#include "transport/ofi/endpoint.h"
#include "transport/ofi/job_key.h"

namespace smddp::testing {
namespace {

constexpr auto kLong = std::chrono::seconds(30);
constexpr size_t kWords = 1024;    // each message: 4 KiB
constexpr int kForeign = 40;       // messages the outsider sends
constexpr uint32_t kP2pTag = 5;
constexpr uint32_t kCollTag = 0x80001001u;  // a collective's step: tag bit 31

OpInfo op_for_test() {
  OpInfo op;
  op.name = "ofi-job-key-test";
  op.timeout = std::chrono::seconds(60);
  op.deadline = Clock::now() + op.timeout;
  return op;
}

void drive_for(ofi::Endpoint& ep, std::chrono::milliseconds t) {
  const auto until = Clock::now() + t;
  while (Clock::now() < until) ep.progress();
}

// Waits for a Store key while driving the endpoint: the outsider's connection is accepted, and
// its messages arrive, only while the victim's libfabric makes progress.
void await_driving(ofi::Endpoint& ep, Store& store, const std::string& key) {
  const auto until = Clock::now() + kLong;
  while (!store.check(key)) {
    if (Clock::now() > until) throw TimeoutError("test: no " + key + " within 30 s", {});
    drive_for(ep, std::chrono::milliseconds(5));
  }
}

// The victim's side: receives posted under `tags` from its peer `from` before the outsider sends
// (`posted_key` set), then the genuine messages (sent once `go_key` is set) must arrive intact,
// and every foreign message must be found and dropped.
void receive_only_the_genuine(ofi::Endpoint& ep, Store& store, int from, const std::string& posted_key,
                              const std::string& foreign_sent_key, const std::string& go_key, Report& rep) {
  std::vector<std::vector<uint32_t>> in(2, std::vector<uint32_t>(kWords, 0));
  const uint32_t tags[2] = {kP2pTag, kCollTag};
  std::vector<ofi::Endpoint::Handle> hs;
  for (int k = 0; k < 2; ++k) hs.push_back(ep.recv(from, in[static_cast<size_t>(k)].data(), kWords * 4, tags[k]));
  store.set(posted_key, {1});
  await_driving(ep, store, foreign_sent_key);
  drive_for(ep, std::chrono::milliseconds(300));  // the foreign messages arrive first
  // More receives under the same tags, posted while foreign messages wait in the queue.
  std::vector<std::vector<uint32_t>> later(2, std::vector<uint32_t>(kWords, 0));
  for (int k = 0; k < 2; ++k)
    hs.push_back(ep.recv(from, later[static_cast<size_t>(k)].data(), kWords * 4, tags[k]));
  store.set(go_key, {1});
  const OpInfo op = op_for_test();
  for (auto& h : hs) ep.wait(h, op);
  for (const auto* set : {&in, &later})
    for (size_t k = 0; k < 2; ++k)
      for (size_t i = 0; i < kWords; ++i)
        if ((*set)[k][i] != static_cast<uint32_t>(0x600D0000u + i)) {
          rep.fail("receive " + std::to_string(k) + " holds " + std::to_string((*set)[k][i]) + " at word " +
                   std::to_string(i) + ": not the genuine sender's data");
          break;
        }
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (ep.foreign_messages_dropped() < 2 * kForeign && Clock::now() < until) ep.progress();
  drive_for(ep, std::chrono::milliseconds(300));  // nothing more is dropped than was sent
  rep.record("dropped", std::to_string(ep.foreign_messages_dropped()));
  if (ep.foreign_messages_dropped() != 2 * kForeign)
    rep.fail("dropped " + std::to_string(ep.foreign_messages_dropped()) + " foreign messages, expected " +
             std::to_string(2 * kForeign));
}

void send_genuine(ofi::Endpoint& ep, int to, Report& rep) {
  std::vector<uint32_t> out(kWords);
  for (size_t i = 0; i < kWords; ++i) out[i] = static_cast<uint32_t>(0x600D0000u + i);
  std::vector<ofi::Endpoint::Handle> hs;
  for (int round = 0; round < 2; ++round)
    for (uint32_t tag : {kP2pTag, kCollTag}) hs.push_back(ep.send(to, out.data(), kWords * 4, tag));
  const OpInfo op = op_for_test();
  for (auto& h : hs) ep.wait(h, op);
}

// The outsider: kForeign messages under each tag the victim receives under, posing as the
// victim's peer (the same sender rank).
void send_foreign(ofi::Endpoint& ep, int to, Report& rep) {
  std::vector<uint32_t> out(kWords, 0xBADBADu);
  std::vector<ofi::Endpoint::Handle> hs;
  for (int i = 0; i < kForeign; ++i)
    for (uint32_t tag : {kP2pTag, kCollTag}) hs.push_back(ep.send(to, out.data(), kWords * 4, tag));
  const OpInfo op = op_for_test();
  for (auto& h : hs) ep.wait(h, op);
}

TEST(OfiJobKey, ConstantTagBitsAreTheSenderFieldAboveTheHighestRank) {
  EXPECT_EQ(ofi::constant_tag_bits(1, 16), 0xFFFF000000000000ULL);
  EXPECT_EQ(ofi::constant_tag_bits(2, 16), 0xFFFE000000000000ULL);
  EXPECT_EQ(ofi::constant_tag_bits(4, 16), 0xFFFC000000000000ULL);
  EXPECT_EQ(ofi::constant_tag_bits(5, 16), 0xFFF8000000000000ULL);
  EXPECT_EQ(ofi::constant_tag_bits(1 << 15, 16), 0x8000000000000000ULL);
  EXPECT_EQ(ofi::constant_tag_bits((1 << 15) + 1, 16), 0u);
}

TEST(OfiJobKey, TokensDifferAndAForeignRecordIsRefusedByName) {
  const auto a = ofi::new_job_token(), b = ofi::new_job_token();
  EXPECT_EQ(a.size(), ofi::kJobTokenBytes);
  EXPECT_NE(a, b);
  EXPECT_NE(ofi::job_key(a), ofi::job_key(b));
  EXPECT_EQ(ofi::job_key(a), ofi::job_key(a));
  try {
    ofi::job_key(std::vector<uint8_t>(7, 1));
    ADD_FAILURE() << "a 7-byte token was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("holds 7 bytes"), std::string::npos) << e.what();
  }
}

// The sweep's schedule: each check bit in turn, the look matching exactly the messages whose bit
// differs from the key's; a bit that found one is looked at again; a period between rounds.
TEST(OfiJobKey, SweepLooksAtEachCheckBitThenRestsAPeriod) {
  using namespace std::chrono_literals;
  const uint64_t key = 0xA5A5000000001234ULL;
  ofi::ForeignSweep s(key, ofi::constant_tag_bits(4, 16), 100ms);  // bits 50..63
  ASSERT_EQ(s.bits().size(), 14u);
  auto t = ofi::ForeignSweep::Clock::now();
  uint64_t tag = 0, ignore = 0;
  std::vector<int> seen;
  for (size_t i = 0; i < 14; ++i) {
    ASSERT_TRUE(s.next(t, &tag, &ignore)) << i;
    EXPECT_FALSE(s.next(t, &tag, &ignore)) << "a second look while one is outstanding";
    const uint64_t bit = ~ignore;
    ASSERT_EQ(bit & (bit - 1), 0u) << "one bit looked at";
    EXPECT_EQ(tag & bit, (key & bit) ^ bit) << "the bit opposite to the key's";
    // A message of ours (its check bits are the key's) never matches; one with that bit flipped does.
    const uint64_t ours = key ^ 0x0001000012345678ULL;
    EXPECT_NE((ours ^ tag) & ~ignore, 0u);
    EXPECT_EQ(((ours ^ bit) ^ tag) & ~ignore, 0u);
    seen.push_back(__builtin_ctzll(bit));
    if (i == 3) {  // found one: the same bit again
      EXPECT_EQ(s.discarded(0x1234), 1u);
      ASSERT_TRUE(s.next(t, &tag, &ignore));
      EXPECT_EQ(__builtin_ctzll(~ignore), seen.back());
    }
    s.found_none(t);
  }
  EXPECT_EQ(seen, s.bits());
  EXPECT_FALSE(s.next(t + 50ms, &tag, &ignore)) << "the next round before its period";
  EXPECT_TRUE(s.next(t + 100ms, &tag, &ignore));
  EXPECT_EQ(s.dropped(), 1u);
}

// The provider each case runs over: "" is smddp's default choice.
class OfiJobKeyOver : public ::testing::TestWithParam<const char*> {};

RunOptions loopback_over(const char* provider) {
  RunOptions ro;
  ro.env = {{"FI_TCP_IFACE", "lo"}, {"SMDDP_DEBUG", "INFO"}};
  if (*provider) ro.env.push_back({"SMDDP_OFI_PROVIDER", provider});
  return ro;
}

// A second job is handed the first's addresses (a wrong MASTER_ADDR, a reused rendezvous
// directory): its rank 1 talks to the first job's rank 0 under its own token.
TEST_P(OfiJobKeyOver, ASecondJobGivenOurAddressesCannotInject) {
  RunOptions ro = loopback_over(GetParam());
  auto res = run_ranks(3, [](int rank, int, std::shared_ptr<Store> store, Report& rep) {
    if (rank < 2) {  // job A
      PrefixStore a("jobA/", store);
      ofi::Endpoint ep(a, rank, 2, rank, kLong);
      if (rank == 0) receive_only_the_genuine(ep, *store, 1, "posted", "foreign-sent", "go", rep);
      if (rank == 1) {
        store->get("go", kLong);
        send_genuine(ep, 0, rep);
      }
    } else {  // job B's rank 1, whose rank 0 "is" job A's rank 0
      PrefixStore b("jobB/", store);
      b.set("ofi/addr/0", store->get("jobA/ofi/addr/0", kLong));
      b.set(ofi::kJobTokenKey, ofi::new_job_token());
      ofi::Endpoint ep(b, 1, 2, 0, kLong);
      store->get("posted", kLong);
      send_foreign(ep, 0, rep);
      store->set("foreign-sent", {1});
    }
    store->set("done/" + std::to_string(rank), {1});
    for (int r = 0; r < 3; ++r) store->get("done/" + std::to_string(r), kLong);
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

// A rank of a finished job lives on (a hung process torchelastic did not reap) while the next
// job starts on the same host and one of its ranks gets the same port: the stale rank's address
// vector now points at the new job's rank.
TEST_P(OfiJobKeyOver, AStaleRankOfAFinishedJobCannotInject) {
  RunOptions ro = loopback_over(GetParam());
  // One port for rank 0's listener, in every job it joins (libfabric reads these once, at its
  // first use in the process: rank 0 sets them before that).
  const std::string port = std::to_string(20000 + ::getpid() % 20000);
  auto res = run_ranks(3, [port](int rank, int, std::shared_ptr<Store> store, Report& rep) {
    if (rank == 0) {
      ::setenv("FI_TCP_PORT_LOW_RANGE", port.c_str(), 1);
      ::setenv("FI_TCP_PORT_HIGH_RANGE", port.c_str(), 1);
      {
        PrefixStore j1("job1/", store);
        ofi::Endpoint ep(j1, 0, 2, 0, kLong);
        store->get("job1/over", kLong);
      }  // job 1 is over for rank 0
      PrefixStore j2("job2/", store);
      ofi::Endpoint ep(j2, 0, 2, 0, kLong);
      if (store->get("job2/ofi/addr/0", kLong) != store->get("job1/ofi/addr/0", kLong))
        rep.fail("precondition: job 2's rank 0 did not get job 1's rank 0's address (port " + port + ")");
      receive_only_the_genuine(ep, *store, 1, "posted", "foreign-sent", "go", rep);
    } else if (rank == 1) {  // job 1's rank 1, stale: it never talked to rank 0 (a connection it had
                             // would have broken as rank 0 left), but it has its address
      PrefixStore j1("job1/", store);
      ofi::Endpoint ep(j1, 1, 2, 1, kLong);
      store->set("job1/over", {1});
      store->get("posted", kLong);
      send_foreign(ep, 0, rep);
      store->set("foreign-sent", {1});
    } else {  // job 2's rank 1
      PrefixStore j2("job2/", store);
      ofi::Endpoint ep(j2, 1, 2, 1, kLong);
      store->get("go", kLong);
      send_genuine(ep, 0, rep);
    }
    store->set("done/" + std::to_string(rank), {1});
    for (int r = 0; r < 3; ++r) store->get("done/" + std::to_string(r), kLong);
  }, ro);
  ASSERT_TRUE(res.ok()) << res.summary();
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiJobKeyOver, ::testing::Values("tcp;ofi_rxm", ""), [](const auto& i) {
  return std::string(*i.param ? "rxm" : "default_provider");
});

}  // namespace
}  // namespace smddp::testing
