// Which libfabric provider the endpoint opens, and how: the order providers are tried in, the
// hints, the provider settings smddp sets before any opens, and where RMA writes pay. Kept apart
// from the endpoint (endpoint.cc), which moves the data.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "transport/ofi/fid.h"

namespace smddp::ofi {

// The largest message this transport hands libfabric; longer ones go in chunks.
inline constexpr size_t kMaxChunk = size_t{1} << 30;

// The providers tried, in order, when none is forced (SMDDP_OFI_PROVIDER, FI_PROVIDER).
std::vector<std::string> default_providers();
// The provider's entries for reliable-datagram tagged messages (`provider` null: every
// provider's); rma: also RMA writes with remote completion data. Empty when it has none.
InfoOwner getinfo(const char* provider, bool rma = false);
// Whether an RMA write cut mid-way crashes the receiving process with this provider.
bool rma_write_cut_crashes(const std::string& provider);
// Collective messages of at least this size go by RMA write (0: never).
size_t rma_threshold(const std::string& provider);

}  // namespace smddp::ofi
