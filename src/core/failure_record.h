// A rank that fails while its peers wait in the Store for a record it would publish (the node's
// segment name, its endpoint's address) publishes why instead, so that they fail at once with its
// reason, not at their timeout with none.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace smddp {

// No real record starts so: a segment's name starts with '/', an address is the provider's
// binary sockaddr or GID, the job token random bytes of a fixed size (job_key.h).
inline constexpr std::string_view kFailedRecord = "!failed: ";

// The record for `why` (an exception's message; its leading "smddp: " dropped, as the reader's
// own message adds one).
inline std::vector<uint8_t> failure_record(std::string_view why) {
  if (why.rfind("smddp: ", 0) == 0) why.remove_prefix(7);
  const std::string text = std::string(kFailedRecord) + std::string(why);
  return std::vector<uint8_t>(text.begin(), text.end());
}

// The reason in a record failure_record() made; nothing for any other record.
inline std::optional<std::string> failure_in(const std::vector<uint8_t>& record) {
  const std::string_view r(reinterpret_cast<const char*>(record.data()), record.size());
  if (r.rfind(kFailedRecord, 0) != 0) return std::nullopt;
  return std::string(r.substr(kFailedRecord.size()));
}

}  // namespace smddp
