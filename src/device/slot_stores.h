// How a rank stores into its staging slots: plain stores, or non-temporal ones where plain stores
// cost several times a copy (SMDDP_SHM_STORES).
//
// A staged round writes this rank's slot, which a peer read a round or two before. Where that
// peer's caches still hold the lines (a chunk smaller than its L2; or always, when it sits behind
// another last-level cache: the "far placement" of docs/performance.md), every store first takes
// its line back from that core: 4-10 times a copy. Non-temporal stores skip the take-back and
// send the lines to memory, and the peer then reads them from there: they cost about the same
// wherever the peer sits (write and read together like cross-memory attach), where plain stores
// cost a copy when the lines are gone and up to ten when they are not. Which one wins depends on
// where the ranks run and can change while they run, so each rank measures both on its own slot
// writes and keeps the cheaper. The store kind changes neither the layout nor the bits, so the
// ranks need not agree on it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "device/device.h"

namespace smddp::device {

enum class StoreKind { plain, streaming };
const char* to_string(StoreKind k);

// One communicator's choice between the store kinds (one rank's: nothing is shared). Not
// thread-safe: the communicator's collectives run one at a time.
//
// Which kind wins depends on the collective and its size as well as on where the ranks run (at
// 1 MiB an allgather's slots stay in the caches whatever the kind; at 4 MiB streaming stores
// were 2.4x as fast), so each class of collectives, by family (the caller's: allreduce,
// allgather, ...) and size (1-4 MiB, 4-16 MiB, ... of message), has a choice of its own.
// Every rank tries both kinds on the same collectives: of a class's collectives, the
// kPlainProbe-th and kStreamingProbe-th of each kPeriod use plain and streaming stores on every
// rank, whatever each chose (every rank counts the same ones: the message sizes agree). A rank's
// own slot writes are only half of what its kind costs: its peers then read those lines, from a
// cache or, after streaming stores, from memory. With every rank on the same kind, the time a
// rank spends writing and reading the slots tells both.
class StoreKindChooser {
 public:
  enum class Setting { automatic, plain, streaming };
  // SMDDP_SHM_STORES's value: auto, plain or streaming. InvalidArgument for anything else, and
  // for streaming where this build has no non-temporal stores (off x86-64), where auto is plain.
  static Setting parse(const std::string& value);

  explicit StoreKindChooser(Setting s);

  static constexpr int kFamilies = 8;
  static constexpr int kSizes = 6;  // 1-4 MiB, 4-16 MiB, ..., 1 GiB and more
  static constexpr size_t kLargeBytes = size_t{1} << 20;

  struct Turn {
    StoreKind kind = StoreKind::plain;
    bool probe = false;  // one of the collectives every rank runs with this kind
    int cls = -1;        // its class, where it has one
  };
  // The kind for the next collective of `family` (0 to kFamilies - 1; -1 where the ranks' sizes
  // may differ: the plain kind, never measured), whose message is `message_bytes` (under
  // kLargeBytes: the kind of the family's smallest class, not measured).
  Turn begin(int family, size_t message_bytes);
  // What that collective cost in its copies and reductions that wrote or read the slots: the
  // bytes they wrote and their nanoseconds. Only probes are counted, and not those that moved
  // under kSampleBytes (too short to time against a stray interrupt). After a probe of each kind
  // the class keeps the kind whose least rate of its last four probes is lower, with a margin
  // for the one it has (kToStreaming, kToPlain).
  void end(Turn turn, size_t bytes, int64_t ns);

  StoreKind current(int cls) const { return classes_[static_cast<size_t>(cls)].current; }
  // The estimate the choice compares, ns per KiB moved (0: not measured yet).
  double estimate(int cls, StoreKind k) const;
  // Times any class's choice changed (for the debug log and tests).
  uint64_t switches() const { return switches_; }
  // The class a collective of `family` with a message of `bytes` counts in.
  static int class_of(int family, size_t bytes);
  // "1-4 MiB" and the like, for the log.
  static std::string size_range(int cls);

  static constexpr size_t kSampleBytes = size_t{256} << 10;
  static constexpr uint64_t kPeriod = 32, kPlainProbe = 6, kStreamingProbe = 7;
  // Streaming once plain costs this many times as much, plain again once it costs less than
  // kToPlain times: the gap keeps the choice from flapping on noise.
  static constexpr double kToStreaming = 1.15, kToPlain = 1.0;

 private:
  // The last few rates measured for one kind; the estimate is their least (a rank descheduled
  // mid-copy only ever inflates a rate).
  struct Rates {
    std::array<double, 4> ns_per_kib{};
    int count = 0, next = 0;
    void add(double r);
    double least() const;
  };
  struct Class {
    StoreKind current = StoreKind::plain;
    std::array<Rates, 2> rates;
    uint64_t begun = 0;  // its large collectives so far
  };
  Setting setting_;
  std::array<Class, kFamilies * kSizes> classes_;
  uint64_t switches_ = 0;
};

// The host device with the chosen kind of stores into one span of memory (a communicator's
// staging slots), timing the copies and reductions of kMinBytes or more that write there or
// read from there. Everything else goes to `inner` as it is. fence() orders the non-temporal stores before the
// peers are told (Context::arrive), then fences `inner`.
class SlotStoreDevice final : public Device {
 public:
  SlotStoreDevice(Device& inner, const std::byte* span, size_t span_bytes, StoreKind kind);
  const char* name() const override { return inner_.name(); }
  void copy(void* dst, const void* src, size_t bytes) override;
  void copy_rows(void* dst, size_t dst_stride, const void* src, size_t src_stride, size_t bytes,
                 size_t rows) override;
  void reduce(const reduce::ReduceArgs& args) override;
  void fence() override;
  bool network_addressable() const override { return inner_.network_addressable(); }
  bool network_reaches(const void* p) const override { return inner_.network_reaches(p); }

  StoreKind kind() const { return kind_; }
  // Bytes the timed copies and reductions wrote (into the span, or out of it), and their time.
  size_t moved() const { return moved_; }
  int64_t spent_ns() const { return spent_ns_; }

  // Writes smaller than this keep plain stores and are not timed: a few lines, where a clock read
  // would cost more than it tells, and a non-temporal store sends to memory what the peer would
  // read from a cache.
  static constexpr size_t kMinBytes = size_t{16} << 10;
  // A reduction into the span with streaming stores reduces pieces of this size into a buffer
  // of the device's own (in L1), then streams each piece out.
  static constexpr size_t kPieceBytes = size_t{16} << 10;

 private:
  bool in_span(const void* p) const;
  bool reads_span(const reduce::ReduceArgs& args) const;
  Device& inner_;
  const std::byte* span_;
  size_t span_bytes_;
  StoreKind kind_;
  bool unfenced_ = false;
  size_t moved_ = 0;
  int64_t spent_ns_ = 0;
  std::vector<const void*> piece_srcs_;
  alignas(64) std::byte piece_[kPieceBytes];
};

}  // namespace smddp::device
