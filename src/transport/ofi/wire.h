// What the libfabric transport reads from a peer besides the data itself: the address it put in
// the Store, the tag a message arrived under and its length, and the RMA ticket a receiver sends
// its sender. libfabric matches
// tags before it places anything (endpoint.h, job_key.h), so what is left to decode is which rank
// sent a message to a receive from any rank, whether a message or ticket has the length that was
// posted for it, and whether a ticket describes the sender's size. Pure functions, the endpoint's
// own checks (tests/fuzz/ofi_message_fuzz.cc, tests/fuzz/rma_ticket_fuzz.cc).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace smddp::ofi {

// A peer's address record in the Store (what its fi_getname wrote) against the length of this
// rank's own address: every rank of a communicator opens the same provider, whose addresses all
// have one length, and fi_av_insert reads that many bytes whatever the record holds. Empty when
// the lengths agree; else what is wrong, for the error.
inline std::string address_record_problem(size_t record_bytes, size_t own_bytes) {
  if (record_bytes == own_bytes) return {};
  return "its address record in the Store has " + std::to_string(record_bytes) + " bytes, where this rank's " +
         "has " + std::to_string(own_bytes) + " (another provider or smddp version, or a corrupted Store)";
}

// How a rank cuts and sends messages, which every rank of a communicator must share (a receive
// posts the chunks and the protocol its sender uses): its largest libfabric message and the size
// from which collective messages go by RMA write (0: never). Carried after the address in its
// record (kWireSettingsBytes, little-endian), so a disagreement is an error when the endpoints
// are made instead of transfers that wait for chunks or tickets that never come.
struct WireSettings {
  uint64_t max_msg = 0, rma_min = 0;
};
inline constexpr size_t kWireSettingsBytes = 16;
inline void append_wire_settings(std::vector<uint8_t>& record, const WireSettings& s) {
  for (uint64_t v : {s.max_msg, s.rma_min})
    for (int b = 0; b < 8; ++b) record.push_back(static_cast<uint8_t>(v >> (8 * b)));
}
// The settings at the end of a record of at least kWireSettingsBytes bytes.
inline WireSettings wire_settings_of(const std::vector<uint8_t>& record) {
  const size_t at = record.size() - kWireSettingsBytes;
  auto word = [&](size_t i) {
    uint64_t v = 0;
    for (int b = 0; b < 8; ++b) v |= static_cast<uint64_t>(record[at + i * 8 + static_cast<size_t>(b)]) << (8 * b);
    return v;
  };
  return {word(0), word(1)};
}
// A peer's settings against this rank's: empty when they agree; else what differs, for the error.
inline std::string wire_settings_problem(const WireSettings& theirs, const WireSettings& ours) {
  auto rma = [](uint64_t v) { return v ? "from " + std::to_string(v) + " bytes" : std::string("never"); };
  if (theirs.max_msg != ours.max_msg)
    return "it cuts messages into libfabric messages of " + std::to_string(theirs.max_msg) + " bytes, this rank into " +
           std::to_string(ours.max_msg) + " (SMDDP_OFI_MAX_MESSAGE must be equal on every rank)";
  if (theirs.rma_min != ours.rma_min)
    return "it sends collective messages by RMA write " + rma(theirs.rma_min) + ", this rank " + rma(ours.rma_min) +
           " (SMDDP_OFI_RMA must be equal on every rank; a provider without RMA writes here sends none)";
  return {};
}

// A tag: the sender's rank (top 16 bits), the caller's tag (32) and a chunk field (low 16), before
// the communicator's key is XORed in.
inline constexpr int kRankBits = 16, kChunkBits = 16;
inline uint64_t make_tag(int sender, uint32_t tag, size_t chunk) {
  return (static_cast<uint64_t>(sender) << 48) | (static_cast<uint64_t>(tag) << kChunkBits) | chunk;
}
// The chunk field that marks an RMA ticket.
inline constexpr uint64_t kTicketChunk = (uint64_t{1} << kChunkBits) - 1;
// A chunk of data: its index (15 bits) and, in the top bit, whether it is its message's last. A
// receive matches each chunk by index whatever that bit says, then compares it, so a sender
// whose message has more or fewer chunks is a size disagreement even where every chunk has the
// length posted (a message of whole max_msg chunks against a receive of fewer). Indexes stay
// below 2^15 - 1, so no data chunk's field is a ticket's.
inline constexpr uint64_t kLastChunkBit = uint64_t{1} << (kChunkBits - 1);
inline constexpr size_t kMaxChunks = (size_t{1} << (kChunkBits - 1)) - 1;
inline uint64_t chunk_field(size_t chunk, size_t nchunks) {
  return chunk | (chunk + 1 == nchunks ? kLastChunkBit : 0);
}
inline constexpr uint64_t kSenderBits = ~uint64_t{0} << (64 - kRankBits);  // make_tag's sender field
// The rank a tag (key removed) names as its sender: how a receive from any rank learns it.
inline int sender_of(uint64_t tag) {
  return static_cast<int>(tag >> (64 - kRankBits));
}

// Point-to-point tags (the caller's bit 31 clear; collectives set it). Messages between a pair
// of ranks are matched in the order the two ranks posted them, as inside a node: the caller field
// carries the message's number among the pair's messages (15 bits, wrapping) and a 16-bit fold of
// the caller's tag. A receive matches the number and ignores the fold, then compares it: a message
// under another tag is an error naming both, where matching by tag would leave the receive
// waiting for a message that never comes (docs/reliability.md).
inline uint32_t fold_tag(uint32_t tag) { return (tag ^ (tag >> 16)) & 0xFFFFu; }
inline uint32_t p2p_field(uint32_t order, uint32_t tag) { return ((order & 0x7FFFu) << 16) | fold_tag(tag); }
inline constexpr uint64_t kP2pFoldBits = uint64_t{0xFFFF} << kChunkBits;         // in make_tag's layout
inline constexpr uint64_t kP2pOrderBits = uint64_t{0x7FFF} << (kChunkBits + 16);  // ditto
inline uint32_t p2p_order_of(uint64_t tag) { return static_cast<uint32_t>((tag & kP2pOrderBits) >> (kChunkBits + 16)); }
// The tag (key removed) a point-to-point chunk arrived under against the caller's `tag` of its
// receive: empty when the folds agree; else the sender's tag as the mismatch error words it.
inline std::string p2p_tag_disagreement(uint32_t tag, uint64_t arrived) {
  const uint32_t theirs = static_cast<uint32_t>((arrived & kP2pFoldBits) >> kChunkBits);
  if (theirs == fold_tag(tag)) return {};
  return "tag " + std::to_string(theirs) + " (or a tag above 65535 that folds to it)";
}

// A received chunk against the one posted for it: chunk `chunk` of a message of `bytes` bytes
// cut into chunks of `max_msg` (the last shorter), which arrived with `len` bytes under the chunk
// field `arrived` (its last-chunk bit). Empty when it is that chunk, as long and as last; else
// what the peer sent, as the size-mismatch error words it: "<bytes up to here> bytes" (it ended
// sooner), or "more than <bytes> bytes" (it goes on past the receive's last chunk).
inline std::string chunk_length_disagreement(size_t bytes, size_t max_msg, size_t chunk, size_t len, uint64_t arrived) {
  const size_t off = chunk * max_msg;
  const size_t want = std::min(max_msg, bytes - std::min(bytes, off));
  const size_t nchunks = bytes == 0 ? 1 : bytes / max_msg + (bytes % max_msg != 0);
  const bool last = chunk + 1 >= nchunks, arrived_last = (arrived & kLastChunkBit) != 0;
  if (len == want && last == arrived_last) return {};
  if (len == want && last) return "more than " + std::to_string(bytes) + " bytes";
  return std::to_string(off + len) + " bytes";
}

// What the receiver of an RMA transfer tells its sender: where to write, and the id its remote
// completions will carry.
struct RmaTicket {
  uint64_t addr = 0, key = 0;
  uint32_t id = 0;
  // The receive's size (low 32 bits: keeps the ticket 24 bytes, within every provider's inject
  // size): the sender refuses to write a message of another size (a disagreement between ranks).
  uint32_t bytes_low = 0;
};
static_assert(sizeof(RmaTicket) == 24);

// A ticket the sender received in `len` bytes: empty when that is a whole ticket; else what the
// peer sent, as the size-mismatch error words it.
inline std::string ticket_length_disagreement(size_t len) {
  return len == sizeof(RmaTicket) ? std::string() : "a ticket of " + std::to_string(len) + " bytes";
}
// A whole ticket against the sender's `bytes`: empty when the receive is of that size (mod 2^32);
// else the receive's size as the size-mismatch error words it. Where to write (addr, key) is the
// provider's to check against the receiver's registration.
inline std::string ticket_size_disagreement(const RmaTicket& t, size_t bytes) {
  return t.bytes_low == static_cast<uint32_t>(bytes) ? std::string()
                                                     : std::to_string(t.bytes_low) + " bytes (mod 2^32)";
}

}  // namespace smddp::ofi
