// What the libfabric transport learns from a received message besides its data (transport/ofi/
// wire.h): the sender's rank from its tag (a receive from any rank) and whether its length is the
// one posted. Any tag must name a rank the tag's sender field holds, nothing else of the tag;
// any length must be taken exactly when it is the posted chunk's (so a taken chunk lies inside
// the receive's buffer) and the chunk is as last as the posted one (a sender of more or fewer
// whole chunks), else refused naming how many bytes the peer's message came to. A
// point-to-point tag keeps its number and its tag's fold apart: a receive's own tag never
// disagrees with a message it numbered, and any other tag folds to what the refusal names.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "transport/ofi/wire.h"

namespace {
template <class T>
T take(const uint8_t* data, size_t size, size_t* at) {
  T v{};
  const size_t n = *at < size ? std::min(sizeof v, size - *at) : 0;
  std::memcpy(&v, data + *at, n);
  *at += n;
  return v;
}
}  // namespace

// Input (little-endian, missing bytes 0): the tag as it arrived (key removed, 8 bytes), the
// receive's size (8), the largest message (4, taken as 1 to 2^30), the chunk (2), its length (8),
// a receive's tag and number (4 + 4).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace smddp::ofi;
  size_t at = 0;
  const auto tag = take<uint64_t>(data, size, &at);
  const auto bytes = static_cast<size_t>(take<uint64_t>(data, size, &at));
  const size_t max_msg = 1 + take<uint32_t>(data, size, &at) % (size_t{1} << 30);
  const auto chunk_in = take<uint16_t>(data, size, &at);
  const auto len = static_cast<size_t>(take<uint64_t>(data, size, &at));
  const auto recv_tag = take<uint32_t>(data, size, &at);
  const auto order = take<uint32_t>(data, size, &at);

  const int sender = sender_of(tag);
  if (sender < 0 || sender >= (1 << kRankBits)) std::abort();
  if ((make_tag(sender, 0, 0) | (tag & ~kSenderBits)) != tag) std::abort();  // the field, and only it
  const auto caller_tag = static_cast<uint32_t>(tag >> kChunkBits);
  const size_t arrived_field = tag & kTicketChunk;
  if (make_tag(sender, caller_tag, arrived_field) != tag) std::abort();

  // Point to point: the number and the fold occupy their own bits of a tag whose bit 31 (the
  // collectives') is clear; the number is the receive's (mod 2^15), whatever the tag.
  const uint32_t field = p2p_field(order, recv_tag);
  if (field & 0x80000000u) std::abort();
  const uint64_t own = make_tag(sender, field, 0);
  if (p2p_order_of(own) != (order & 0x7FFFu)) std::abort();
  if ((own & ~(kSenderBits | kP2pOrderBits | kP2pFoldBits)) != 0) std::abort();
  if (!p2p_tag_disagreement(recv_tag, own).empty()) std::abort();
  // Any arrived tag: refused exactly when its fold is not the receive's, naming that fold.
  const std::string other = p2p_tag_disagreement(recv_tag, tag);
  const uint32_t arrived_fold = static_cast<uint32_t>((tag & kP2pFoldBits) >> kChunkBits);
  if (other.empty() != (arrived_fold == fold_tag(recv_tag))) std::abort();
  if (!other.empty() && other.rfind("tag " + std::to_string(arrived_fold) + " ", 0) != 0) std::abort();

  // A completion belongs to one of the receive's chunks; a message of more chunks than a tag can
  // number is refused before anything is posted (make_request).
  const size_t nchunks = bytes == 0 ? 1 : bytes / max_msg + (bytes % max_msg != 0);
  if (nchunks > kMaxChunks) return 0;
  const size_t chunk = chunk_in % nchunks, off = chunk * max_msg;
  // A chunk's field names its index and whether it is the last, and is never a ticket's.
  const uint64_t posted = chunk_field(chunk, nchunks);
  const bool last = chunk + 1 == nchunks;
  if ((posted & ~kLastChunkBit) != chunk || ((posted & kLastChunkBit) != 0) != last) std::abort();
  // (A receive ignores the last-chunk bit: not even so may a chunk's field match a ticket's.)
  if ((posted | kLastChunkBit) == kTicketChunk || (chunk_field(kMaxChunks - 1, kMaxChunks) | kLastChunkBit) == kTicketChunk)
    std::abort();
  // The chunk taken: as long as posted and as last, else refused naming what the sender sent
  // (the arrived tag's chunk field gives its last-chunk bit).
  const bool arrived_last = (tag & kLastChunkBit) != 0;
  const size_t want = last ? bytes - off : max_msg;  // the last chunk is shorter
  const std::string theirs = chunk_length_disagreement(bytes, max_msg, chunk, len, tag & kTicketChunk);
  if (theirs.empty() != (len == want && last == arrived_last)) std::abort();
  if (theirs.empty() && (len > max_msg || off + len > bytes)) std::abort();
  const std::string said = len == want && last ? "more than " + std::to_string(bytes) + " bytes"
                                                : std::to_string(off + len) + " bytes";
  if (!theirs.empty() && theirs != said) std::abort();
  return 0;
}
