#include "transport/shm/shm_group.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "core/cpu_relax.h"
#include "core/failure_record.h"
#include "device/host_copy.h"
#include "smddp/errors.h"
#include "transport/shm/shm_group_layout.h"

namespace smddp::shm {

namespace layout {
bool process_dead(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  std::ifstream f(path);
  if (!f) return true;
  std::string line;
  std::getline(f, line);
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

const std::string kMoreRoom =
    "give /dev/shm more room (docker run --shm-size=1g; on Kubernetes an emptyDir of medium Memory at /dev/shm)";

namespace {
// This process's groups that hold a segment now: a /dev/shm without room for one more may be
// full of the others (a process group per mesh dimension, per HSDP replica...), which the
// message then says.
std::atomic<int> live_groups{0};
}  // namespace

std::string other_groups_note(int self) {
  const int n = live_groups.load(std::memory_order_relaxed) - self;
  if (n <= 0) return "";
  return " (this process already belongs to " + std::to_string(n) + " other communicator" + (n == 1 ? "" : "s") +
         " on this node, each with shared memory of its own there: every process group and subgroup has one)";
}
}  // namespace layout

using namespace layout;

namespace {
constexpr uint64_t kMagic = 0x736d646470736d32ULL;  // "smddpsm2"

// On every collective's path, so it is short: each word times an odd constant of its own, the
// products summed (independent multiplies issue together, where a chained mix waits on each),
// then one multiply spreads every bit into the top 24. Fingerprints that differ in one word
// always differ in the sum (an odd factor is invertible mod 2^64); a difference then survives
// into the 24 bits but for one case in 2^24.
uint64_t fingerprint_hash(const uint64_t* words, size_t n) {
  static constexpr uint64_t kOdd[] = {0x9e3779b97f4a7c15ULL, 0xc2b2ae3d27d4eb4fULL, 0x165667b19e3779f9ULL,
                                      0xd6e8feb86659fd93ULL, 0xff51afd7ed558ccdULL, 0xc4ceb9fe1a85ec53ULL,
                                      0x94d049bb133111ebULL, 0xbf58476d1ce4e5b9ULL};
  static_assert(Group::kFingerprintWords <= std::size(kOdd));
  uint64_t h = 0;
  for (size_t i = 0; i < n; ++i) h += words[i] * kOdd[i];
  h = (h ^ (h >> 32)) * 0xd6e8feb86659fd93ULL;  // the top bits of a product depend on every bit
  const uint64_t top = h >> kHashShift;          // 24 bits
  return top ? top : 1;                          // never 0: 0 means "nothing announced"
}

uint64_t pid_namespace_id() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

// Process-shared futex (the word lives in the segment, so no FUTEX_PRIVATE_FLAG).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Where a node-mate that cannot map the node's segment says why, for rank 0 waiting on it.
std::string attach_failure_key(int rank) { return "shm/attach_failed/" + std::to_string(rank); }

std::string ranks_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
}  // namespace

Group::Group(Store& store, int rank, int size, GroupConfig cfg, std::chrono::milliseconds timeout,
             std::vector<int> global_ranks)
    : rank_(rank), size_(size), cfg_(cfg), fifo_owner_(2 * static_cast<size_t>(size), nullptr),
      ring_reserved_(static_cast<size_t>(size), 0),
      seen_(static_cast<size_t>(size), 0), global_(std::move(global_ranks)),
      next_liveness_check_(static_cast<size_t>(size) + 1) {
  cfg_.slot_bytes = round_up(std::max<size_t>(cfg_.slot_bytes, kPage), kPage);
  cfg_.slot_parts = std::max(cfg_.slot_parts, 1);
  const size_t slots_per_rank = 2 * static_cast<size_t>(cfg_.slot_parts);
  size_t fifo = kPage;
  while (fifo < cfg_.fifo_bytes) fifo <<= 1;
  cfg_.fifo_bytes = fifo;
  static_assert(sizeof(Header) <= kPage);
  ctl_off_ = kPage;
  slot_off_ = ctl_off_ + round_up(sizeof(RankCtl) * size, kPage);
  fifo_off_ = slot_off_ + cfg_.slot_bytes * slots_per_rank * size;
  fifo_stride_ = kPage + cfg_.fifo_bytes;  // FifoCtl on its own page, then the ring
  size_t total = fifo_off_ + fifo_stride_ * size * size;
  pidns_ = pid_namespace_id();

  auto deadline = Clock::now() + timeout;
  if (rank == 0) {
    if (pidns_ != 0) unlink_orphaned_segments(pidns_);
    const std::string name = new_segment_name(pidns_);
    try {
      // Everything but the rings of the point-to-point FIFOs, which most jobs never use: a
      // sender reserves its ring before its first push (fifo_push), and a receiver reads a ring
      // only where its sender wrote. Their control pages (head, tail) are read by receivers that
      // wait on any rank, so they are reserved here with the rest.
      seg_ = Segment::create(name, total, fifo_off_);
      for (size_t pair = 0; pair < static_cast<size_t>(size) * size; ++pair)
        seg_.reserve(fifo_off_ + pair * fifo_stride_, kPage);
    } catch (const SystemError& e) {
      std::string why = e.what();
      if (dynamic_cast<const NoRoomError*>(&e)) {
        const std::string n = std::to_string(size);
        why += ": the node's " + n + " ranks share " + std::to_string(slots_per_rank) + " x " + n +
               " staging slots of " + std::to_string(cfg_.slot_bytes) + " bytes (SMDDP_SHM_CHUNK; " +
               std::to_string(slots_per_rank) + " per rank by SMDDP_SHM_AHEAD)" + other_groups_note(0) + "; " +
               kMoreRoom + " or lower SMDDP_SHM_CHUNK or SMDDP_SHM_AHEAD";
      }
      // The node's other ranks wait for the name: hand them the reason instead, so that every
      // rank fails now with it, not at the timeout with none.
      store.set("shm/name", failure_record(why));
      throw SystemError(why);
    }
    auto* h = new (seg_.data()) Header{};
    h->magic = kMagic;
    h->size = static_cast<uint32_t>(size);
    h->slot_bytes = cfg_.slot_bytes;
    h->slot_parts = static_cast<uint32_t>(cfg_.slot_parts);
    h->fifo_bytes = cfg_.fifo_bytes;
    store.set("shm/name", std::vector<uint8_t>(name.begin(), name.end()));
  } else {
    auto v = store.get("shm/name", timeout);
    if (auto why = failure_in(v))
      throw SystemError("smddp: rank " + std::to_string(global(rank)) + ": rank " + std::to_string(global(0)) +
                        " could not make the node's shared memory: " + *why);
    try {
      const std::string name(v.begin(), v.end());
      {
        // The header first: a layout that needs a larger segment than rank 0's (a larger
        // SMDDP_SHM_CHUNK or SMDDP_SHM_AHEAD here) must read as the disagreement it is, not as
        // a segment "smaller than expected".
        const Segment head = Segment::open(name, kPage);
        const auto* h = static_cast<const Header*>(head.data());
        // Empty where rank 0's layout is this rank's.
        const auto layout_difference = [&](const Header& theirs) {
          if (theirs.magic != kMagic) return std::string("its segment is not of this smddp version");
          std::string d;
          const auto differs = [&](const char* what, uint64_t rank0s, uint64_t mine) {
            if (rank0s == mine) return;
            d += std::string(d.empty() ? "" : "; ") + what + " " + std::to_string(rank0s) + " there, " +
                 std::to_string(mine) + " here";
          };
          differs("ranks on the node", theirs.size, static_cast<uint64_t>(size));
          differs("staging slot bytes (SMDDP_SHM_CHUNK)", theirs.slot_bytes, cfg_.slot_bytes);
          differs("slot parts (SMDDP_SHM_AHEAD + 1)", theirs.slot_parts, static_cast<uint64_t>(cfg_.slot_parts));
          differs("FIFO bytes (SMDDP_SHM_FIFO)", theirs.fifo_bytes, cfg_.fifo_bytes);
          return d;
        };
        if (const std::string d = layout_difference(*h); !d.empty())
          throw InvalidArgument("smddp: rank " + std::to_string(global(rank)) +
                                ": shared-memory layout differs from rank " + std::to_string(global(0)) +
                                "'s (SMDDP_SHM_* settings must agree): " + d);
      }
      seg_ = Segment::open(name, total);
    } catch (const std::exception& e) {
      // Rank 0 waits for this rank to attach: tell it why it never will (else it times out).
      store.set(attach_failure_key(rank), failure_record(e.what()));
      throw;
    }
  }
  // Let the other ranks (same user) read our memory with process_vm_readv where Yama restricts
  // ptrace to descendants; the single-copy algorithms need it. No-op without Yama.
  if (cfg_.let_peers_read) ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  RankCtl* me = ctl(rank);
  me->pidns = pidns_;
  me->pid.store(::getpid(), std::memory_order_release);
  header()->attached.fetch_add(1, std::memory_order_acq_rel);

  if (rank == 0) {
    // Unlink as soon as everyone has the mapping: from here on no exit can leak the segment.
    for (int polls = 1; header()->attached.load(std::memory_order_acquire) < static_cast<uint32_t>(size); ++polls) {
      // Every 10 ms: a node-mate that could not map the segment said why (above).
      for (int r = 1; polls % 100 == 0 && r < size; ++r) {
        if (ctl(r)->pid.load() != 0 || !store.check(attach_failure_key(r))) continue;
        const auto why = failure_in(store.get(attach_failure_key(r), timeout));
        seg_.unlink();
        throw SystemError("smddp: rank " + std::to_string(global(0)) + ": rank " + std::to_string(global(r)) +
                          " could not join the node's shared memory: " + why.value_or("(no reason given)"));
      }
      if (Clock::now() > deadline) {
        std::vector<int> missing;
        for (int r = 0; r < size; ++r)
          if (ctl(r)->pid.load() == 0) missing.push_back(r);
        seg_.unlink();
        missing = global(missing);
        throw TimeoutError("smddp: shared-memory setup on rank " + std::to_string(global(0)) + " timed out after " +
                               std::to_string(timeout.count()) + " ms: ranks " + ranks_str(missing) +
                               " never attached",
                           missing);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    seg_.unlink();
  }
  live_groups.fetch_add(1, std::memory_order_relaxed);  // last: a constructor that threw is not counted
}

Group::~Group() {
  depart();
  live_groups.fetch_sub(1, std::memory_order_relaxed);
}

void Group::depart() {
  if (!departed_ && seg_.data()) {
    ctl(rank_)->departed.store(1, std::memory_order_release);
    departed_ = true;
    ring(/*always=*/true);
    ring_all_fifo_bells();  // a node-mate's send or receive to this rank finds it gone at once
  }
}

Group::Header* Group::header() const { return static_cast<Header*>(seg_.data()); }
Group::RankCtl* Group::ctl(int r) const {
  return reinterpret_cast<RankCtl*>(static_cast<std::byte*>(seg_.data()) + ctl_off_) + r;
}
std::byte* Group::slot(int r, int parity, int part) const {
  const size_t index = (static_cast<size_t>(r) * 2 + static_cast<size_t>(parity)) * static_cast<size_t>(cfg_.slot_parts) +
                       static_cast<size_t>(part);
  return static_cast<std::byte*>(seg_.data()) + slot_off_ + index * cfg_.slot_bytes;
}
uint64_t* Group::words(int r, int parity) const { return ctl(r)->words[parity]; }
Group::FifoCtl* Group::fifo(int src, int dst) const {
  return reinterpret_cast<FifoCtl*>(static_cast<std::byte*>(seg_.data()) + fifo_off_ +
                                    (static_cast<size_t>(src) * size_ + dst) * fifo_stride_);
}
std::byte* Group::fifo_data(int src, int dst) const { return reinterpret_cast<std::byte*>(fifo(src, dst)) + kPage; }

int Group::pid_of(int r) const { return ctl(r)->pid.load(std::memory_order_acquire); }

void Group::publish_deadline(Clock::time_point deadline) {
  ctl(rank_)->deadline_ns.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count(),
      std::memory_order_relaxed);
  // The thread that runs this collective, which may not be the one that ran the last round.
  publish_cpu();
}

// Off the step's line and read only by waiters that spun a while (shares_cpu_with, move_off_cpu).
// Where reading the CPU is a system call, only every 16th time: a stale CPU only makes a waiter
// miss a peer stacked on its own, until the next one.
void Group::publish_cpu() {
  if (!cpu_number_is_cheap_ && (++cpu_publications_ & 15) != 1) return;
  ctl(rank_)->cpu_plus1.store(::sched_getcpu() + 1, std::memory_order_relaxed);
}

Clock::time_point Group::latest_deadline(const std::vector<int>& ranks) const {
  int64_t ns = 0;
  for (int r : ranks) ns = std::max(ns, ctl(r)->deadline_ns.load(std::memory_order_relaxed));
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

void Group::arrive() {
  step_ = (step_ + 1) & kCountMask;
  publish_cpu();
  ctl(rank_)->step.store(step_ | (fp_hash_ << kHashShift), std::memory_order_release);
  ring(/*always=*/false);
}

uint64_t Group::step_of(int r) const { return count_of(ctl(r)->step.load(std::memory_order_acquire)); }
int64_t Group::rounds_since(int r, uint64_t base) const {
  return rounds_ahead(ctl(r)->step.load(std::memory_order_acquire), base & kCountMask);
}
std::byte* Group::exposed(int r, int which) const { return ctl(r)->exposed[which]; }
void Group::mark_exposed() { ctl(rank_)->exposed_for.store(step_ + 1, std::memory_order_relaxed); }
bool Group::exposed_for(int r, uint64_t base) const {
  return ctl(r)->exposed_for.load(std::memory_order_relaxed) == base + 1;
}

namespace {
uint64_t claim_word(uint64_t count, int claimer) {
  return (count & kCountMask) | (static_cast<uint64_t>(claimer) + 1) << kHashShift;
}
}  // namespace

// The owner's claim may be older than its last round (collectives that take no rounds do not
// claim theirs). It may also be newer than the next: while the owner was not running, node-mates
// may have taken several rounds in a row (each claims only the round after r's last claimed one,
// and only once that one is published: take_round). Then the owner claims none of them; it
// awaits each in turn, which is over at once for all but the first.
bool Group::claim_round() {
  std::atomic<uint64_t>& claim = ctl(rank_)->claim;
  const uint64_t next = (step_ + 1) & kCountMask;
  uint64_t c = claim.load(std::memory_order_acquire);
  do {
    if (rounds_ahead(c, next) >= 0) return false;
  } while (!claim.compare_exchange_weak(c, claim_word(next, rank_), std::memory_order_acq_rel));
  return true;
}

bool Group::take_round(int r, uint64_t count) {
  const uint64_t before = (count - 1) & kCountMask;
  uint64_t c = ctl(r)->claim.load(std::memory_order_acquire);
  if (count_of(c) != before || step_of(r) != before) return false;
  return ctl(r)->claim.compare_exchange_strong(c, claim_word(count, rank_), std::memory_order_acq_rel);
}

void Group::publish_taken_round(int r, uint64_t count) {
  // r alone writes its hash (announce, then its first arrive); it cannot announce again before
  // this round is published, so the word read here carries the hash r announced last.
  const uint64_t w = ctl(r)->step.load(std::memory_order_relaxed);
  ctl(r)->step.store((count & kCountMask) | (hash_of(w) << kHashShift), std::memory_order_release);
  ring(/*always=*/false);
}

void Group::await_taken_round(const OpInfo& op) {
  const uint64_t next = (step_ + 1) & kCountMask;
  const int taker = static_cast<int>(hash_of(ctl(rank_)->claim.load(std::memory_order_acquire))) - 1;
  wait([&] { return rounds_ahead(ctl(rank_)->step.load(std::memory_order_acquire), next) >= 0; },
       [&] { return std::vector<int>{taker}; }, op, "finish the round it took from this rank");
  step_ = next;
}

// Publisher side of the eventcount (see Header). The fence orders this rank's store before its
// read of `sleepers`; a sleeper orders its count before its read of the words it waits on. So
// either the sleeper sees the store or this rank sees the sleeper. Both fences are the StoreLoad
// barrier the pattern needs and release/acquire alone do not give (x86's store buffer, and Arm's
// LDAPR, which may read before an earlier release store lands): never "redundant".
namespace {
void ring_bell(std::atomic<uint32_t>& bell, const std::atomic<uint32_t>& sleepers, bool always) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!always && sleepers.load(std::memory_order_relaxed) == 0) return;
  bell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&bell);
}
}  // namespace

void Group::ring(bool always) { ring_bell(header()->doorbell, header()->sleepers, always); }

void Group::ring_fifo_bell(int r, bool always) { ring_bell(ctl(r)->fifo_bell, ctl(r)->fifo_sleepers, always); }

template <class Ready>
void Group::sleep_on_bell(std::atomic<uint32_t>& bell, std::atomic<uint32_t>& sleepers, Ready ready,
                          std::chrono::nanoseconds timeout) {
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint32_t seen = bell.load(std::memory_order_seq_cst);
  // A ring after `seen` makes the futex return at once; one before it came after the store
  // ready() reads, so ready() sees it. abort() rings too, after its word: an abort that rang
  // between the caller's last look at that word and `seen` is seen here, or the waiter would
  // sleep out its whole timeout (up to the 20 ms liveness check) before it noticed.
  if (!ready() && !aborted()) futex_wait(&bell, seen, timeout);
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

template <class Ready>
void Group::sleep_until_rung(Ready ready, std::chrono::nanoseconds timeout) {
  sleep_on_bell(header()->doorbell, header()->sleepers, ready, timeout);
}

void Group::sleep_on_fifos(const std::function<bool()>& ready, std::chrono::nanoseconds timeout) {
  sleep_on_bell(ctl(rank_)->fifo_bell, ctl(rank_)->fifo_sleepers, ready, timeout);
}

void Group::ring_all_fifo_bells() {
  for (int r = 0; r < size_; ++r) ring_fifo_bell(r, /*always=*/false);
}

std::vector<int> Group::global(const std::vector<int>& locals) const {
  std::vector<int> out;
  for (int r : locals) out.push_back(global(r));
  return out;
}

std::vector<int> Group::behind(uint64_t target) const {
  std::vector<int> v;
  for (int r = 0; r < size_; ++r)
    if (rounds_ahead(ctl(r)->step.load(std::memory_order_acquire), target) < 0) v.push_back(r);
  // A late rank's round that a node-mate took waits on that node-mate (take_round): if it died
  // holding the round, that is the rank to name, and the one whose liveness decides.
  const size_t late = v.size();
  for (size_t i = 0; i < late; ++i) {
    const uint64_t c = ctl(v[i])->claim.load(std::memory_order_acquire);
    const int taker = static_cast<int>(hash_of(c)) - 1;
    if (taker >= 0 && taker < size_ && taker != v[i] && rounds_ahead(c, step_of(v[i])) > 0 &&
        std::find(v.begin(), v.end(), taker) == v.end())
      v.push_back(taker);
  }
  return v;
}

void Group::wait_all(const OpInfo& op, int lag) {
  if (fp_pending_) lag = 0;
  const uint64_t target = (step_ - static_cast<uint64_t>(lag)) & kCountMask;
  wait(
      [&] {
        for (int r = 0; r < size_; ++r) {
          // Kept: the word that let this wait end carries the hash the peer announced for this
          // round; read again later, the peer may have moved on to the next collective.
          seen_[static_cast<size_t>(r)] = ctl(r)->step.load(std::memory_order_acquire);
          if (rounds_ahead(seen_[static_cast<size_t>(r)], target) < 0) return false;
        }
        return true;
      },
      [&] { return behind(target); }, op, "arrive", /*may_take_rounds=*/true);
  if (!fp_pending_) return;
  // The common case, without a call: every rank's word, as the wait saw it, is at this round
  // and carries this rank's hash (its own word included). Anything else is settled in full.
  const uint64_t agreed = target | (fp_hash_ << kHashShift);
  bool all_agreed = true;
  for (const uint64_t w : seen_) all_agreed &= w == agreed;
  if (all_agreed) fp_pending_ = false;
  else compare_fingerprints(target);
}

// Double buffering: a rank can announce the next collective only after this one's first round,
// which every rank leaves only after comparing this one's fingerprints, so a buffer is never
// rewritten while a rank may still read it.
void Group::announce(const Fingerprint& fp) {
  const int parity = static_cast<int>(announcements_++ & 1);
  std::memcpy(ctl(rank_)->fingerprint[parity], fp.data(), sizeof(Fingerprint));
  fp_hash_ = fingerprint_hash(fp.data(), fp.size());
  fp_pending_ = true;
}

void Group::compare_fingerprints(uint64_t target) {
  fp_pending_ = false;
  const int parity = static_cast<int>((announcements_ - 1) & 1);
  const uint64_t* mine = ctl(rank_)->fingerprint[parity];
  bool same = true;
  for (int r = 0; r < size_ && same; ++r) {
    if (r == rank_) continue;
    // The peer's step word as the wait saw it: at this round, its hash is the one it announced
    // for this collective. A peer already past the round then may have announced the next one;
    // its fingerprint for this one is still in its buffer of this parity.
    const uint64_t w = seen_[static_cast<size_t>(r)];
    if (rounds_ahead(w, target) == 0 && hash_of(w) == fp_hash_) continue;
    same = std::memcmp(ctl(r)->fingerprint[parity], mine, sizeof(Fingerprint)) == 0;
  }
  if (same || !on_disagreement_) return;
  std::vector<Fingerprint> all(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r)
    std::memcpy(all[static_cast<size_t>(r)].data(), ctl(r)->fingerprint[parity], sizeof(Fingerprint));
  on_disagreement_(all);
}

bool Group::aborted() const { return header()->abort_state.load(std::memory_order_acquire) != 0; }

void Group::abort(const std::string& reason, bool mismatch) {
  int32_t expected = 0;
  if (header()->abort_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    header()->abort_mismatch = mismatch ? 1 : 0;
    std::snprintf(header()->abort_reason, sizeof header()->abort_reason, "%s", reason.c_str());
    header()->abort_state.store(2, std::memory_order_release);
    ring(/*always=*/true);
    ring_all_fifo_bells();
  }
}

bool Group::aborted_by_mismatch() const {
  return header()->abort_state.load(std::memory_order_acquire) == 2 && header()->abort_mismatch;
}

std::string Group::abort_reason() const {
  int32_t s = header()->abort_state.load(std::memory_order_acquire);
  if (s == 0) return "";
  // 1: a rank is writing its reason. It may have died in between: wait a bounded time only.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (s == 1 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
    s = header()->abort_state.load(std::memory_order_acquire);
  }
  if (s == 1) return "(the aborting rank did not finish writing its reason)";
  // Written by another process: bounded by the array, whatever it holds.
  const char* r = header()->abort_reason;
  return std::string(r, strnlen(r, sizeof header()->abort_reason));
}

void Group::throw_if_aborted(const OpInfo& op) const {
  int32_t s = header()->abort_state.load(std::memory_order_acquire);
  if (s == 0) return;
  throw AbortedError("smddp: " + op.describe() + " failed: the communicator was aborted: " + abort_reason());
}

int Group::lost_rank(const std::vector<int>& ranks, std::string* why) const {
  for (int r : ranks) {
    const RankCtl* c = ctl(r);
    if (c->departed.load(std::memory_order_acquire)) {
      *why = "left (destroyed its communicator)";
      return r;
    }
    int pid = c->pid.load(std::memory_order_acquire);
    // pidns is written before pid is published: read it only once a pid is there.
    if (pid > 0 && c->pidns == pidns_ && process_dead(pid)) {
      *why = "died (pid " + std::to_string(pid) + ")";
      return r;
    }
  }
  return -1;
}

bool Group::shares_cpu_with(const std::vector<int>& late) const {
  const int mine = ::sched_getcpu();
  if (mine < 0) return false;
  for (int r : late)
    if (r != rank_ && ctl(r)->cpu_plus1.load(std::memory_order_relaxed) == mine + 1) return true;
  return false;
}

// Why move rather than only sleep: a sleeper leaves its peer alone in the run queue, so no idle
// CPU ever pulls one of the two away, and the pair stays stacked, each round paying a wake-up
// (through torch, 20-40 us per 8-byte allreduce for whole runs). Narrowing the thread's affinity
// to the other CPUs moves it at once; restoring the affinity right after leaves it where it went,
// and the user's mask as it was. At most once a millisecond: a scheduler that keeps stacking the
// two gets a sleeper in between.
bool Group::move_off_cpu() {
  if (!cfg_.move_off_shared_cpu) return false;
  const auto now = Clock::now();
  if (now < next_move_) return false;
  std::vector<int> busy;  // the CPUs the other ranks last ran on: not a place to move to
  for (int r = 0; r < size_; ++r) {
    const int c = ctl(r)->cpu_plus1.load(std::memory_order_relaxed) - 1;
    if (r != rank_ && c >= 0) busy.push_back(c);
  }
  if (!move_to_another_cpu(busy)) return false;
  next_move_ = now + std::chrono::milliseconds(1);  // moves, not failed tries: those sleep anyway
  // Where this rank runs now, for a peer that waits on it before its next arrive().
  ctl(rank_)->cpu_plus1.store(::sched_getcpu() + 1, std::memory_order_relaxed);
  return true;
}

template <class Ready, class Missing>
void Group::wait(Ready ready, Missing missing, const OpInfo& op, const char* waiting_for, bool may_take_rounds) {
  // A rank we wait for that last arrived from this rank's CPU most likely waits in this CPU's run
  // queue: the scheduler stacked the two (a busy process on the other core, torch's threads, a
  // wake-up placed beside its waker) although the affinities leave room. Spinning on then only
  // delays it by the whole spin (about 300 us here), once per round: 256 rounds of a 64 MiB
  // allreduce made 3x outliers (docs/performance.md). So past a short spin, a waiter that finds
  // this moves itself to another CPU it may run on and spins on there (see move_off_cpu), or,
  // where it cannot, sleeps at once.
  constexpr int kStackCheckAt = 512;
  for (int i = 0; i < cfg_.spin; ++i) {
    if (ready()) return;
    if (i == kStackCheckAt && shares_cpu_with(missing()) && !move_off_cpu()) break;
    cpu_relax();
  }
  // The sleeps below also end for work that came for the idle hook: a send submitted beside the
  // collective sets the engine's mark and then rings, and one that came after the loop's last
  // look at the hook but rang before the sleep read the bell would wait out the whole sleep.
  // Read after the bell, the mark is seen (sleep_on_bell).
  const auto ready_or_news = [&] { return ready() || (idle_news_ && idle_news_()); };
  const auto start = Clock::now();
  auto next_check = start + std::chrono::milliseconds(10);  // liveness reads /proc: not on every wait
  Clock::time_point deadline = op.deadline;  // moved once, to a late rank's own (below)
  int sleep_us = 2, quiet_us = 200;
  // From then on the wait tries to take a late rank's round, again after each try that found
  // none, at intervals doubling to 1 ms (a rank in mid-round, or peers not far enough); its sleeps
  // end then at the latest, since the late rank, not running, rings nobody.
  const bool take = may_take_rounds && round_helper_ && !fp_pending_;
  Clock::time_point take_at = take ? start + cfg_.take_after : Clock::time_point::max();
  std::chrono::microseconds take_every = cfg_.take_after;
  while (!ready()) {
    // An abort that came after every awaited rank arrived (a rank that found a mismatch in this
    // very round) must not hide this round's own outcome: look at the abort word first, then
    // at readiness again.
    if (aborted() && !ready()) throw_if_aborted(op);
    auto now = Clock::now();
    if (take && now >= take_at) {
      if (round_helper_()) {
        take_every = cfg_.take_after;
        continue;  // perhaps ready now; if not, another round may be there to take
      }
      take_every = std::min(take_every * 2, std::chrono::microseconds(1000));
      take_at = now + take_every;
    }
    if (idle_ && (!idle_only_while_ || idle_only_while_())) {
      // Across nodes the wait drives the network (idle_), which no doorbell announces: poll.
      // Yield for the first couple of milliseconds, then sleep, backing off to 200 us. A rank
      // with no transfer in flight has nothing for the network to announce to it; what its
      // polling still moves is a peer's (a message sent ahead of its receive, which waits in the
      // kernel until then; a first connection; a provider's own protocol), and a pipelined
      // transfer's next piece may be one (a 16 MiB allreduce over 2 hosts x 2 ranks took 8%
      // longer when such waits slept from 2 ms on). So once its wait has lasted 10 ms, longer
      // than a pipelined piece takes (most likely it waits for a node-mate that waits for a
      // straggler elsewhere), such a rank sleeps until rung, as a wait inside a node does, for
      // 200 us doubling up to the liveness check's 20 ms, driving the network between sleeps: a
      // sleep is at most as long as those before it together, and so is what it may delay.
      // Polling on, it woke about 3300 times a second (docs/performance.md).
      constexpr auto kQuietAfter = std::chrono::milliseconds(10);
      const bool moving = idle_();
      if (now - start < std::chrono::milliseconds(2)) {
        ::sched_yield();
      } else if (!moving && now - start >= kQuietAfter) {
        const auto quiet = std::chrono::microseconds(quiet_us);
        const auto until = std::min({next_check, deadline, now + quiet, std::max(take_at, now)});
        sleep_until_rung(ready_or_news,
                         std::max<std::chrono::nanoseconds>(until - now, std::chrono::microseconds(1)));
        if (until == now + quiet) quiet_us = std::min(quiet_us * 2, 20000);  // only after a whole sleep
        now = Clock::now();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
        sleep_us = std::min(sleep_us * 2, 200);
        now = Clock::now();
      }
    } else if (cfg_.yield_to_peers && now >= no_yield_until_ && now - start < std::chrono::microseconds(500)) {
      // More ranks than cores: the rank we wait for is most likely runnable on this core, and a
      // yield hands it over faster than a sleep and a wake-up (measured 2x at 8 B, w=4 on 2
      // cores). A yield that took long handed the core to a process that is not one of ours for
      // its whole time slice: then sleep instead, for a while.
      ::sched_yield();
      const auto after = Clock::now();
      if (after - now > std::chrono::milliseconds(1)) no_yield_until_ = after + std::chrono::milliseconds(100);
      now = after;
    } else {
      // Block until a rank arrives (or the next liveness check is due).
      const auto until = std::min({next_check, deadline, std::max(take_at, now)});
      sleep_until_rung(ready_or_news, std::max<std::chrono::nanoseconds>(until - now, std::chrono::microseconds(1)));
      now = Clock::now();
    }
    // A deadline between two liveness checks is looked at once it passes, not at the next check
    // (the sleeps above would otherwise shrink to 1 us until then).
    if (now < next_check && now < deadline) continue;
    next_check = now + std::chrono::milliseconds(20);
    std::vector<int> late = missing();
    std::string why;
    int lost = lost_rank(late, &why);
    if (lost >= 0 && !ready()) {
      // A rank that failed wrote why into the abort word before it left (its communicator's
      // destruction departs it): that reason names the rank really lost (a peer on another node,
      // say), where its leaving would name only the messenger.
      if (aborted()) throw_if_aborted(op);
      throw PeerError("smddp: " + op.describe() + ": rank " + std::to_string(global(lost)) + " " + why +
                          " while this rank waited for it to " + waiting_for,
                      global(lost));
    }
    if (now >= deadline && !ready()) {
      // The late ranks are alive. One still inside this collective, whose own clock started a
      // little after this rank's (its previous collective ended later), is most likely stuck on
      // something further away, a peer on another node, and its own timeout will say which:
      // let it, so that the error every rank raises names that cause rather than a node-mate
      // waiting for it. A late rank that never began this collective published an older deadline.
      // Its time past the deadline: to notice (one liveness check) and to write the abort word.
      // A deadline more than a timeout away was not published at a collective's start (a clock
      // of another time namespace): ignored.
      constexpr auto kToReport = std::chrono::milliseconds(500);
      const Clock::time_point theirs = latest_deadline(late) + kToReport;
      if (deadline == op.deadline && theirs > now && theirs - now <= op.timeout + kToReport) {
        deadline = theirs;
        continue;
      }
      throw TimeoutError("smddp: " + op.describe() + ": timeout after " + std::to_string(op.timeout.count()) +
                             " ms: ranks " + ranks_str(global(late)) + " did not " + waiting_for,
                         global(late));
    }
  }
}

void Group::check_progress(int peer, const OpInfo& op, const char* waiting_for) {
  throw_if_aborted(op);
  const auto now = Clock::now();
  Clock::time_point& next = next_liveness_check_[static_cast<size_t>(peer + 1)];
  // A departure is one load, looked for at every poll: a rank woken by its peer's departure (the
  // FIFO bell it rang) finds it at once. Whether a process died reads /proc: every 20 ms.
  const bool departed = peer >= 0 && ctl(peer)->departed.load(std::memory_order_acquire);
  if (!departed && now < next && now < op.deadline) return;
  next = now + std::chrono::milliseconds(20);
  std::string why;
  if (peer >= 0 && lost_rank({peer}, &why) >= 0)
    throw PeerError("smddp: " + op.describe() + ": rank " + std::to_string(global(peer)) + " " + why +
                        " while this rank waited for it to " + waiting_for,
                    global(peer));
  if (now >= op.deadline) {
    const int who = peer >= 0 ? global(peer) : op.peer;
    if (who < 0)  // a receive from any rank, none of which sent
      throw TimeoutError("smddp: " + op.describe() + ": timeout after " + std::to_string(op.timeout.count()) +
                             " ms waiting for any rank to " + waiting_for,
                         {});
    throw TimeoutError("smddp: " + op.describe() + ": timeout after " + std::to_string(op.timeout.count()) +
                           " ms: rank " + std::to_string(who) + " did not " + waiting_for,
                       {who});
  }
}

}  // namespace smddp::shm
