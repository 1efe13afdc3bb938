// The shared-memory state of the ranks of one communicator on one node.
//
// One segment per communicator, created by local rank 0 under a random name (mode 0600) and
// unlinked as soon as every rank has mapped it, so it never outlives the processes, whatever
// way they exit; where rank 0 dies before that, the next rank 0 on the node unlinks it
// (unlink_orphaned_segments). It holds:
//   - per rank, a step counter: arrive() bumps mine; wait_all() waits until every rank's counter
//     reaches mine. Collectives are sequences of such rounds.
//   - per rank, two staging slots (by round parity). A round writes my slot, arrives, waits for
//     all, then reads any slot. Double buffering makes one sync per round enough: a slot is
//     written again two rounds later, after the round in between proved every rank had finished
//     reading it. Each slot comes in GroupConfig::slot_parts parts: the staged allreduce uses
//     them as a ring deep enough for a rank to run rounds ahead of a late peer (wait_all's lag).
//   - per ordered pair of ranks, a single-producer single-consumer byte FIFO for send/recv.
//   - an abort word: the first rank that fails a collective writes why, and every wait of every
//     other rank raises an error at once instead of running into its own timeout.
//   - per rank, a fingerprint of the collective it is running (double-buffered like the words),
//     compared by the first wait_all() after it was announced: ranks that disagree about a
//     collective find out in the round they already share, before any data is combined.
// Waits spin briefly, then sleep on a futex in the segment that arrive() rings when someone
// sleeps (with more ranks on this kernel than cores, yield briefly first; across nodes, where the network must
// be polled: yield, then sleep); a waiter whose late peer last ran on its own CPU stops spinning
// there (Group::wait). Each one watches the deadline, the abort word and whether the ranks it
// waits for are still alive.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/op_info.h"
#include "smddp/store.h"
#include "transport/shm/cpu_move.h"
#include "transport/shm/shm_segment.h"

namespace smddp::shm {

struct GroupConfig {
  size_t slot_bytes = 256 << 10;  // tests' default; the library's is core/shm_settings.cc's
  // Slots per rank and parity (SMDDP_SHM_AHEAD + 1): the staged allreduce lets a rank run that
  // many rounds less one ahead of its slowest node-mate (allreduce_rs_ag.cc); other collectives
  // use the first.
  int slot_parts = 1;
  size_t fifo_bytes = 256 << 10;  // power of two
  int spin = 2000;
  bool yield_to_peers = false;  // more ranks on this kernel than CPUs: yield briefly before sleeping
  // A waiter whose late peer last ran on its own CPU moves to another CPU of its affinity (false:
  // it never touches its thread's affinity, and sleeps instead).
  bool move_off_shared_cpu = true;
  // Where Yama restricts ptrace to descendants, declare PR_SET_PTRACER_ANY so that the node's
  // other ranks (any process of the same user) may read this rank's memory by cross-memory attach
  // (device/cma_window.cc). False where no algorithm would read it (docs/security.md).
  bool let_peers_read = true;
  // A rank whose wait for a late node-mate has lasted `take_after` may do that rank's next round
  // of the staged allreduce or reduce for it (SMDDP_SHM_STEAL; Group::take_round).
  bool take_rounds = true;
  std::chrono::microseconds take_after{50};
};

class Group {
 public:
  static constexpr int kWords = 8;  // small per-rank values a round can exchange

  // Collective over the local ranks: rank 0 creates the segment, the others map it.
  // `global_ranks` names the local ranks in messages (the communicator's ranks when the group is
  // one node of several); empty: local and global ranks are the same.
  Group(Store& store, int rank, int size, GroupConfig cfg, std::chrono::milliseconds timeout,
        std::vector<int> global_ranks = {});
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  // The communicator's rank of local rank `local` (how messages name it).
  int global(int local) const { return global_.empty() ? local : global_[static_cast<size_t>(local)]; }
  int size() const { return size_; }
  // Process id of local rank r (single-copy reads of its memory: device/peer_window.h).
  int pid_of(int r) const;

  // --- rounds ---
  size_t slot_bytes() const { return cfg_.slot_bytes; }
  int slot_parts() const { return cfg_.slot_parts; }
  // Every rank's slots, one span from slot(0, 0): what CUDA page-locks.
  size_t all_slots_bytes() const { return 2 * static_cast<size_t>(size_ * cfg_.slot_parts) * cfg_.slot_bytes; }
  int begin_round() { return static_cast<int>(round_++ & 1); }
  std::byte* slot(int r, int parity, int part = 0) const;
  uint64_t* words(int r, int parity) const;  // kWords values, same double buffering as slots
  void arrive();
  // Waits until every rank's counter reaches mine less `lag` rounds: with lag > 0 a rank runs
  // ahead of its peers by up to that many rounds (a collective whose slots outlast that many
  // rounds: allreduce_rs_ag.cc). A collective's first wait is always a full one (lag 0 while its
  // fingerprint is not yet compared), as must be its last.
  void wait_all(const OpInfo& op, int lag = 0);
  // Called while a wait is idle (past its first spins). Across nodes it drives the network's
  // progress, so transfers posted before a shared-memory stage move on during it: providers with
  // manual progress (tcp, rxm) move a rendezvous only while the sender polls. Returns whether
  // this rank still has transfers in flight; with none, a wait that has lasted 10 ms sleeps on
  // the doorbell between calls, for longer and longer (wait()). Also, for the length of one
  // collective, what polls the sends and receives in flight beside it (CommunicatorImpl).
  // `only_while`, when set, gates the hook: while it returns false the wait is the node's own, as
  // without a hook (inside a node: sends and receives that may come while the collective runs).
  // `news`, when set, says whether work came for the hook that its last call did not see (a send
  // submitted meanwhile, which wakes the waiters too): a wait's sleep does not begin while it
  // returns true, so work that came between the wait's last look and its sleep is not left
  // there until the sleep ends (up to the liveness check, 20 ms).
  void set_idle_hook(std::function<bool()> f, std::function<bool()> only_while = {},
                     std::function<bool()> news = {}) {
    idle_ = std::move(f);
    idle_only_while_ = std::move(only_while);
    idle_news_ = std::move(news);
  }
  const std::function<bool()>& idle_hook() const { return idle_; }
  const std::function<bool()>& idle_hook_gate() const { return idle_only_while_; }
  const std::function<bool()>& idle_hook_news() const { return idle_news_; }
  // Wakes this node's ranks that sleep in a wait (a spurious wake-up for those with nothing new):
  // for a wait whose idle hook has work that no node-mate announces (a send submitted meanwhile).
  void wake_waiters() { ring(/*always=*/true); }

  // --- rounds taken by a node-mate (work stealing: allreduce_rs_ag.cc) ---
  // A collective whose every round a rank could do for another (its own copies and reductions,
  // through a peer window onto the other's buffers) lets a rank that would wait for a late
  // node-mate do that rank's next round instead: with more busy processes than cores the late
  // rank is most likely not running, and every round it does not have to do is one its peers
  // need not wait for (docs/algorithms.md, "Taking a late rank's round").
  static constexpr size_t kExposedBytes = 96;  // a peer-window descriptor (device/peer_window.h)
  uint64_t step() const { return step_; }       // this rank's round count (its last arrive())
  uint64_t step_of(int r) const;                // rank r's, as published
  int64_t rounds_since(int r, uint64_t base) const;  // rank r's rounds since count `base`
  // The owner, before each round of such a collective: true when it claimed the round (it does
  // it, then arrive()s); false when a node-mate took it: then await_taken_round().
  bool claim_round();
  // Waits until the node-mate that took this rank's round published it (as this rank's
  // arrive() would have), failing as wait_all() does (that rank died, an abort, the deadline).
  void await_taken_round(const OpInfo& op);
  // A waiting rank: claims rank r's round that makes its step `count`, if r has not claimed it
  // (r's last claimed round is the one before, and r finished it). Exactly one rank wins a round.
  bool take_round(int r, uint64_t count);
  // After doing it: rank r's step is `count` (with the fingerprint hash r's word carries), and
  // the node's sleepers are rung.
  void publish_taken_round(int r, uint64_t count);
  std::byte* exposed(int r, int which) const;  // rank r's descriptors: 0 send, 1 recv
  // This rank wrote its descriptors for the collective that began at its step(); published by
  // its next arrive(). Whether rank r did so for the collective that began at `base`.
  void mark_exposed();
  bool exposed_for(int r, uint64_t base) const;
  // Called by wait_all() while it waits for late ranks, once it has waited `take_after` (and
  // never in a collective's first wait, before its fingerprints are compared): takes a late
  // rank's round if it can, returning whether it did. Set for the length of one collective.
  void set_round_helper(std::function<bool()> f) { round_helper_ = std::move(f); }
  uint64_t rounds_taken() const { return rounds_taken_; }  // by this rank from node-mates, ever
  void count_taken_round() { ++rounds_taken_; }
  bool take_rounds() const { return cfg_.take_rounds; }

  // Publishes the deadline of the collective this rank begins: a node-mate whose wait for this
  // rank times out first waits until then (plus the time to report), so the error names what
  // this rank waited for. Same clock in every process of a node (CLOCK_MONOTONIC).
  void publish_deadline(Clock::time_point deadline);

  // --- agreement ---
  // A compact description of a collective (what, how many, which type, op, root): ranks that run
  // the same collective announce equal fingerprints. What the words mean is the caller's.
  static constexpr int kFingerprintWords = 7;
  using Fingerprint = std::array<uint64_t, kFingerprintWords>;
  // Publishes this rank's fingerprint; call before the collective's first arrive(). The first
  // wait_all() after it compares every rank's with this one (each rank published its own before
  // arriving) and, if any differs, calls the disagreement handler, which throws.
  void announce(const Fingerprint& fp);
  // True from announce() until a wait_all() compared the fingerprints.
  bool announcement_pending() const { return fp_pending_; }
  void set_disagreement_handler(std::function<void(const std::vector<Fingerprint>&)> h) {
    on_disagreement_ = std::move(h);
  }

  // --- point to point ---
  // A push rings the receiver's FIFO bell and a pop the sender's, where that rank sleeps on it
  // (sleep_on_fifos): the peer waiting for bytes or for room wakes at once.
  size_t fifo_push(int dst, const void* data, size_t bytes);  // returns bytes accepted (maybe 0)
  size_t fifo_pop(int src, void* data, size_t bytes);         // returns bytes taken (maybe 0)
  // Sleeps on this rank's FIFO bell until a node-mate's push to it or pop of what it sent, an
  // abort or a departure rings it (or wake_fifo_sleeper, or `timeout`), unless ready(), asked
  // once this thread counts as a sleeper, is true: for the thread that waits on point-to-point
  // progress (the engine's P2pSleep).
  void sleep_on_fifos(const std::function<bool()>& ready, std::chrono::nanoseconds timeout);
  void wake_fifo_sleeper() { ring_fifo_bell(rank_, /*always=*/true); }
  size_t fifo_available(int src) const;                       // bytes ready to pop
  // Copies `bytes` from `offset` bytes past the FIFO's next byte, without popping
  // (offset + bytes <= available).
  void fifo_peek(int src, void* data, size_t bytes, size_t offset = 0) const;
  // Operations in flight on this rank take turns per FIFO: the first to claim one (in issue
  // order, as the engine polls) moves its whole message before another may touch it, so two
  // sends to, or receives from, the same peer never interleave their bytes. Only on the thread
  // that polls point-to-point ops (the engine's, or a running collective's: engine.h).
  bool claim_fifo(bool outgoing, int peer, const void* who);  // true while `who` holds it
  void release_fifo(bool outgoing, int peer, const void* who);
  bool fifo_claimed(bool outgoing, int peer) const;
  // Receives from any rank (op numbers `seq`, OpInfo::seq) resolve one at a time, in issue order,
  // and a receive issued after an unresolved one may not claim a FIFO whose next message the
  // earlier one may take (it is not here yet, or opens under the earlier one's tag): it would
  // take the message the earlier one is owed. (Across nodes PairOrder holds every later receive
  // back, the messages unseen until received.) Only on the thread that polls point-to-point ops.
  void open_any(uint64_t seq, uint32_t tag) {
    open_any_seq_ = seq;
    open_any_tag_ = tag;
  }
  void close_any(uint64_t seq) {
    if (open_any_seq_ == seq) open_any_seq_ = 0;
  }
  // Whether a receive from any rank issued before op `seq` is unresolved.
  bool any_open_before(uint64_t seq) const { return open_any_seq_ != 0 && open_any_seq_ < seq; }
  uint32_t open_any_tag() const { return open_any_tag_; }  // its tag, while any_open_before
  // Throws if the communicator was aborted, the peer is gone, or the deadline passed. peer < 0:
  // the rank is not known yet (a receive from any rank) or on another node: the error names
  // op.peer where it is known.
  void check_progress(int peer, const OpInfo& op, const char* waiting_for);
  // A receive from any rank that found no message (the deadline is the caller's: check_progress
  // or the network's): at most every 20 ms it looks at the other ranks of this node. It throws
  // PeerError once one died leaving nothing for it (as ULFM fails a receive from
  // MPI_ANY_SOURCE at any process's failure: the message may have been that rank's; a process
  // that exits without destroying its communicator has died too), and says whether every other
  // rank has left or died leaving nothing for it, while no send
  // of this rank to itself is moving: then no rank of this node can send the message (the caller
  // decides, knowing whether other nodes could). Alone in the communicator: never none_left.
  // `left_one(r)`: whether rank r, gone, may still give this receive its message (its FIFO holds
  // one under the receive's tag, or a receive of this rank is reading it).
  enum class Senders { not_looked, some_may_send, none_left };
  Senders check_any_sender(const OpInfo& op, const std::function<bool(int)>& left_one);

  // --- failure ---
  // Tells every rank the communicator is dead (first caller's reason wins). `mismatch`: the
  // reason is ranks disagreeing about a collective (aborted_by_mismatch()).
  void abort(const std::string& reason, bool mismatch = false);
  bool aborted() const;
  bool aborted_by_mismatch() const;
  std::string abort_reason() const;
  // Throws AbortedError, with the reason, if the communicator was aborted.
  void throw_if_aborted(const OpInfo& op) const;
  // Marks this rank as gone (destructor does it): peers waiting on it fail at once.
  void depart();

 private:
  struct Header;
  struct RankCtl;
  struct FifoCtl;
  Header* header() const;
  RankCtl* ctl(int r) const;
  FifoCtl* fifo(int src, int dst) const;
  std::byte* fifo_data(int src, int dst) const;
  // Ranks among `ranks` that died or departed: -1 when none.
  int lost_rank(const std::vector<int>& ranks, std::string* why) const;
  // Whether a rank of `late` last arrived from the CPU this thread runs on.
  bool shares_cpu_with(const std::vector<int>& late) const;
  // Moves the calling thread to another CPU of its affinity (false: it cannot, or did so within
  // the last millisecond), leaving its affinity as it was.
  bool move_off_cpu();
  void publish_cpu();  // where this rank runs, for its waiters
  std::vector<int> behind(uint64_t target) const;
  Clock::time_point latest_deadline(const std::vector<int>& ranks) const;
  // `target`: the round count of the wait that compares (the first after announce()).
  void compare_fingerprints(uint64_t target);
  std::vector<int> global(const std::vector<int>& locals) const;

  template <class Ready, class Missing>
  void wait(Ready ready, Missing missing, const OpInfo& op, const char* waiting_for, bool may_take_rounds = false);
  // An eventcount: a bell (the futex word) and the count of its sleepers.
  template <class Ready>
  void sleep_on_bell(std::atomic<uint32_t>& bell, std::atomic<uint32_t>& sleepers, Ready ready,
                     std::chrono::nanoseconds timeout);
  template <class Ready>
  void sleep_until_rung(Ready ready, std::chrono::nanoseconds timeout);  // on the rounds' doorbell
  void ring(bool always);  // wakes the rounds' sleepers (always, or only if some sleep)
  void ring_fifo_bell(int r, bool always);  // wakes rank r's point-to-point sleeper
  void ring_all_fifo_bells();               // an abort or departure: every rank's that sleeps

  int rank_;
  int size_;
  GroupConfig cfg_;
  Segment seg_;
  size_t ctl_off_ = 0, slot_off_ = 0, fifo_off_ = 0, fifo_stride_ = 0;
  uint64_t step_ = 0;
  uint64_t round_ = 0;
  uint64_t pidns_ = 0;
  bool departed_ = false;
  std::function<bool()> idle_;
  std::function<bool()> idle_only_while_;
  std::function<bool()> idle_news_;
  std::function<bool()> round_helper_;
  uint64_t rounds_taken_ = 0;
  std::vector<const void*> fifo_owner_;  // [outgoing * size_ + peer]: the op moving a message
  // [dst]: this rank reserved the ring of its FIFO to dst (fifo_push); touched, like
  // fifo_owner_, only by the thread moving point-to-point messages.
  std::vector<uint8_t> ring_reserved_;
  uint64_t announcements_ = 0;
  bool fp_pending_ = false;
  uint64_t fp_hash_ = 0;  // of the last announced fingerprint, carried in every step word
  std::vector<uint64_t> seen_;  // per rank: its step word when the last wait_all() ended
  std::function<void(const std::vector<Fingerprint>&)> on_disagreement_;
  std::vector<int> global_;
  uint64_t open_any_seq_ = 0;  // the unresolved receive from any rank (0: none)
  uint32_t open_any_tag_ = 0;
  // [peer + 1]: when check_progress next looks for that peer's loss (index 0: a receive from any
  // rank). Per peer: one clock for the group let the first operation polled take every check.
  std::vector<Clock::time_point> next_liveness_check_;
  Clock::time_point next_sender_check_{};  // check_any_sender: when it next looks at the ranks
  Clock::time_point no_yield_until_{};  // a yield lost the core to another process: sleep till then
  Clock::time_point next_move_{};      // move_off_cpu: not again before then
  const bool cpu_number_is_cheap_ = cpu_number_is_cheap();
  uint32_t cpu_publications_ = 0;
};

}  // namespace smddp::shm
