// The per-communicator key of the libfabric transport (docs/security.md).
//
// Rank 0 of a communicator draws a random token and puts it in the Store; every rank derives a
// 64-bit key from it and XORs the key into every tag it sends or receives under, and into the
// remote completion data of its RMA writes. A message from a process outside the communicator
// (a second job that was handed our addresses, a stale rank of a finished job whose port one of
// our ranks reuses, an older build) carries another key: it matches none of our receives, so it
// is never written into a buffer of ours. Tags are the only thing libfabric matches before it
// places data, which is why the key lives there and not in a header inside the data.
//
// Such messages wait in the provider's queue of unexpected messages. ForeignSweep finds them
// there: some tag bits are 0 in every tag a rank of ours sends (the sender field above the
// highest rank), so on the wire they equal the key's bits, and a queued message where one of them
// differs is foreign. The sweep is pure scheduling (which bit to look at, when, what was found);
// the endpoint posts the looks (FI_PEEK | FI_DISCARD) and reports what came back.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace smddp::ofi {

// The Store key rank 0 puts the token under (inside the communicator's own prefix).
inline constexpr const char* kJobTokenKey = "ofi/job_token";
inline constexpr size_t kJobTokenBytes = 16;

// kJobTokenBytes random bytes from the kernel (getrandom); SystemError if it has none to give.
std::vector<uint8_t> new_job_token();
// The 64-bit key of a token: InvalidArgument, naming what was found, for a record that is not
// kJobTokenBytes long (another build's, or not a token at all).
uint64_t job_key(const std::vector<uint8_t>& token);

// Tag bits that are 0 in every tag a rank of a communicator of `size` ranks sends: the bits of
// the sender field (the top `rank_bits` of the tag) above the highest rank. None from 2^15 + 1
// ranks up when rank_bits is 16: such communicators are still protected by the key, only not swept.
uint64_t constant_tag_bits(int size, int rank_bits);

class ForeignSweep {
 public:
  using Clock = std::chrono::steady_clock;
  // `key`: this communicator's; `check_bits`: constant_tag_bits(); `period`: the time between
  // two sweeps of all the bits.
  ForeignSweep(uint64_t key, uint64_t check_bits, std::chrono::milliseconds period);

  // The next look to post if one is due at `now` and none is outstanding: a tag and an ignore
  // mask that match exactly the queued messages whose current check bit differs from the key's.
  bool next(Clock::time_point now, uint64_t* tag, uint64_t* ignore);
  // The outstanding look discarded a message (its wire tag): counted; the same bit is looked at
  // again next, since more may wait. Returns the count so far.
  size_t discarded(uint64_t wire_tag);
  // The outstanding look found nothing: on to the next bit; after the last, wait a period.
  void found_none(Clock::time_point now);
  // The provider cannot look (no FI_PEEK): no more sweeps.
  void disable() { enabled_ = false; }

  bool enabled() const { return enabled_; }
  size_t dropped() const { return dropped_; }
  uint64_t last_tag() const { return last_tag_; }
  std::vector<int> bits() const { return bits_; }

 private:
  uint64_t key_;
  std::vector<int> bits_;  // bit positions to look at, in order
  std::chrono::milliseconds period_;
  bool enabled_ = true;
  bool outstanding_ = false;
  size_t current_ = 0;  // index into bits_
  Clock::time_point due_{};
  size_t dropped_ = 0;
  uint64_t last_tag_ = 0;
};

// "0x" and 16 hex digits: how logs show a tag.
std::string hex_tag(uint64_t tag);

}  // namespace smddp::ofi
