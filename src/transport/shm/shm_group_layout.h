// The segment's layout and the helpers the files of shm::Group share (shm_group.cc, shm_fifo.cc):
// private to src/transport/shm. Every process of a node maps one segment, so a change here is a
// change of the shared format: bump kMagic with it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/shm/shm_group.h"

namespace smddp::shm {

namespace layout {
inline constexpr size_t kPage = 4096;
inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// A step word: the rank's round count in the low 40 bits, and in the high 24 a hash of the
// fingerprint it announced last (0 before any). Peers poll the step word anyway, so comparing
// hashes costs them no extra cache line; the full fingerprints are read only when a hash
// differs or the peer already moved past the round (docs/reliability.md). Counts compare
// modulo 2^40 (ranks are never more than a few rounds apart), so they may wrap.
inline constexpr int kHashShift = 40;
inline constexpr uint64_t kCountMask = (uint64_t{1} << kHashShift) - 1;
inline uint64_t count_of(uint64_t word) { return word & kCountMask; }
inline uint64_t hash_of(uint64_t word) { return word >> kHashShift; }
// How far `word`'s count is ahead of `target` (negative: behind), modulo 2^40.
inline int64_t rounds_ahead(uint64_t word, uint64_t target) {
  const uint64_t d = (count_of(word) - target) & kCountMask;
  return d & (uint64_t{1} << (kHashShift - 1)) ? static_cast<int64_t>(d) - (int64_t{1} << kHashShift)
                                               : static_cast<int64_t>(d);
}

// True when the process is gone or a zombie (killed but not yet reaped).
bool process_dead(int pid);

// The fix a NoRoomError's message ends with.
extern const std::string kMoreRoom;

// Said of this process's other groups with a segment now, for a /dev/shm without room for one
// more; `self`: 1 where the asking group is itself counted (once constructed).
std::string other_groups_note(int self);
}  // namespace layout

// Atomics that other processes read through the segment must be lock-free: a lock-based
// std::atomic keeps its lock in this process, where the others cannot see it.
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free &&
              std::atomic<int32_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free);

struct Group::Header {
  uint64_t magic;
  uint32_t size;
  uint32_t slot_parts;
  uint64_t slot_bytes;
  uint64_t fifo_bytes;
  std::atomic<uint32_t> attached;
  std::atomic<int32_t> abort_state;  // 0 none, 1 being written, 2 written
  uint32_t abort_mismatch;           // written before state 2: the reason is a disagreement
  char abort_reason[1024];
  // An eventcount: a rank done spinning counts itself in `sleepers` and sleeps on `doorbell` (a
  // futex); arrive() rings it only when someone sleeps, so the fast path pays a fence and a
  // load. Blocking instead of yielding matters when the cores are shared (torch's threads,
  // dataloaders, more ranks than cores): a yielding waiter keeps its place in the run queue and
  // burns the time slice the rank it waits for needs, and a woken sleeper runs at once.
  alignas(64) std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> sleepers;
};

struct alignas(128) Group::RankCtl {
  std::atomic<uint64_t> step;  // alone on its cache line: the hot word
  char pad[120];
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> departed;
  // 1 + the CPU this rank last arrived from or began a collective on (0: unknown, as the
  // zero-filled segment starts). A waiter whose late peer last ran on the waiter's own CPU stops
  // spinning (Group::wait).
  std::atomic<int32_t> cpu_plus1;
  uint64_t pidns;
  // The deadline of the collective this rank runs (or last ran), steady clock in ns: a rank whose
  // wait for it times out first lets it report its own cause (Group::wait).
  std::atomic<int64_t> deadline_ns;
  uint64_t words[2][kWords];
  // Off the step's line: writing it there made peers polling the step fetch the line twice
  // (measured no faster at 8 B; docs/reliability.md).
  alignas(64) uint64_t fingerprint[2][kFingerprintWords];
  // This rank's point-to-point eventcount (Header's pattern, one per rank): its engine thread
  // sleeps on `fifo_bell` (Group::sleep_on_fifos) until a push into one of its FIFOs or a pop
  // from one it fills rings it, so no other rank's traffic wakes it.
  alignas(64) std::atomic<uint32_t> fifo_bell;
  std::atomic<uint32_t> fifo_sleepers;
  // Who does this rank's next round of a collective that lets node-mates take rounds
  // (allreduce_rs_ag.cc): the step count that round makes, and 1 + the rank that claimed it
  // (high bits, as a step word's hash). The owner claims each round before it works; a waiting
  // node-mate may claim it instead (Group::take_round), and exactly one compare-exchange wins.
  alignas(64) std::atomic<uint64_t> claim;
  // The step count at which the collective whose buffers `exposed` describes began (+1, so the
  // zero-filled segment means none): a node-mate takes rounds only of a rank that exposed its
  // buffers for the collective they both run (SMDDP_SHM_STEAL may differ between ranks).
  std::atomic<uint64_t> exposed_for;
  // What the rank exposed of its buffers for such a collective (send, recv): peer-window
  // descriptors, written before the collective's first arrive().
  alignas(64) std::byte exposed[2][Group::kExposedBytes];
};

struct Group::FifoCtl {
  alignas(64) std::atomic<uint64_t> head;  // bytes ever pushed (producer writes)
  alignas(64) std::atomic<uint64_t> tail;  // bytes ever popped (consumer writes)
};

}  // namespace smddp::shm
