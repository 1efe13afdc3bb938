// An RMA ticket is what the receiving process tells the sender before the sender writes into its
// buffer (transport/ofi/wire.h). Any bytes, arriving in any length, against a send of any size:
// the sender writes only on a whole ticket (24 bytes) that states the send's own size (mod 2^32:
// a receive of another size is refused by name, MismatchError); otherwise it refuses, naming the
// length it got or the size the ticket states.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "transport/ofi/wire.h"

// Input: the ticket's bytes as the receiver sent them (up to 24; missing bytes stay 0, as in a
// ticket the provider filled only partly), then the sender's size (8 bytes) and the length the
// ticket arrived in (8); without them, the size the ticket states and a whole ticket.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace smddp::ofi;
  RmaTicket t;
  std::memcpy(&t, data, std::min(size, sizeof t));
  uint64_t bytes = t.bytes_low, len = sizeof t;
  if (size >= sizeof t + 8) std::memcpy(&bytes, data + sizeof t, 8);
  if (size >= sizeof t + 16) std::memcpy(&len, data + sizeof t + 8, 8);

  // The endpoint's order: the length when the ticket's receive completes, its size before the
  // first write (only for a ticket whose length was right).
  std::string theirs = ticket_length_disagreement(static_cast<size_t>(len));
  if (theirs.empty()) theirs = ticket_size_disagreement(t, static_cast<size_t>(bytes));
  const bool writes = theirs.empty();
  if (writes != (len == sizeof t && t.bytes_low == static_cast<uint32_t>(bytes))) std::abort();
  if (!writes && len != sizeof t && theirs != "a ticket of " + std::to_string(len) + " bytes") std::abort();
  if (!writes && len == sizeof t && theirs != std::to_string(t.bytes_low) + " bytes (mod 2^32)") std::abort();
  return 0;
}
