// A point-to-point message over shared memory starts with a 16-byte header the sending process
// wrote into the FIFO (core/p2p.h). Any 16 bytes against any posted receive must be taken only
// when they announce exactly the receive's tag and size (so the body read is bounded by the
// receiver's buffer), else be refused: SystemError naming the peer for a header that is not one,
// InvalidArgument naming both sizes for another message. Never anything else.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/p2p.h"
#include "smddp/errors.h"

namespace {
bool says(const std::string& what, const std::string& text) {
  return what.find(text) != std::string::npos;
}
}  // namespace

// Input: the header as the peer wrote it, then the receive's tag (4 bytes) and size (8); without
// them the receive expects what the header announces.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using smddp::p2p::Header;
  if (size < sizeof(Header)) return 0;
  Header h;
  std::memcpy(&h, data, sizeof h);
  uint32_t tag = h.tag;
  uint64_t bytes = h.bytes;
  if (size >= sizeof h + 12) {
    std::memcpy(&tag, data + sizeof h, 4);
    std::memcpy(&bytes, data + sizeof h + 4, 8);
  }
  smddp::OpInfo op;
  op.name = "recv";
  op.seq = 5;
  op.rank = 1;
  op.size = 4;
  op.peer = 3;
  const bool chosen = smddp::p2p::opens_message(h, tag);  // what a receive from any rank would pick
  try {
    smddp::p2p::check_header(h, tag, static_cast<size_t>(bytes), 3, op);
    if (h.magic != smddp::p2p::kMagic || h.tag != tag || h.bytes != bytes || !chosen) std::abort();
  } catch (const smddp::SystemError& e) {
    if (h.magic == smddp::p2p::kMagic || chosen || !says(e.what(), "from rank 3")) std::abort();
  } catch (const smddp::InvalidArgument& e) {
    if (h.magic != smddp::p2p::kMagic || (h.tag == tag && h.bytes == bytes)) std::abort();
    if (!says(e.what(), std::to_string(h.bytes) + " bytes with tag " + std::to_string(h.tag)) ||
        !says(e.what(), std::to_string(bytes) + " bytes with tag " + std::to_string(tag)))
      std::abort();
  }
  return 0;
}
