#include "core/slot_store_turns.h"

#include "core/logging.h"

namespace smddp {

using algorithms::CollArgs;
using algorithms::CollKind;

namespace {
// -1 where the ranks' sizes may differ (alltoall, gather, scatter): plain stores, never probed.
int store_family(const CollArgs& a) {
  switch (a.kind) {
    case CollKind::allreduce:
    case CollKind::broadcast:
    case CollKind::reduce:
    case CollKind::allgather:
    case CollKind::reduce_scatter: return static_cast<int>(a.kind);
    default: return -1;
  }
}
static_assert(static_cast<int>(CollKind::reduce) < device::StoreKindChooser::kFamilies &&
              static_cast<int>(CollKind::broadcast) < device::StoreKindChooser::kFamilies);

size_t message_bytes_everywhere(const CollArgs& a, int size) {
  const size_t bytes = a.count * dtype_size(a.dtype);
  return a.kind == CollKind::allgather || a.kind == CollKind::reduce_scatter ? bytes * static_cast<size_t>(size) : bytes;
}
}  // namespace

device::StoreKindChooser::Turn begin_slot_stores(device::StoreKindChooser& c, const CollArgs& a, int size) {
  return c.begin(store_family(a), message_bytes_everywhere(a, size));
}

void end_slot_stores(device::StoreKindChooser& c, device::StoreKindChooser::Turn turn,
                     const device::SlotStoreDevice& d, int rank) {
  const uint64_t switches = c.switches();
  c.end(turn, d.moved(), d.spent_ns());
  if (turn.probe) {
    SMDDP_LOG(TRACE, rank) << "slot stores probe: " << d.moved() << " bytes moved with " << device::to_string(turn.kind)
                           << " stores in " << d.spent_ns() << " ns";
  }
  if (c.switches() != switches) {
    SMDDP_LOG(INFO, rank) << "stores into the staging slots: "
                          << algorithms::to_string(static_cast<CollKind>(turn.cls / device::StoreKindChooser::kSizes))
                          << " of " << device::StoreKindChooser::size_range(turn.cls) << " now "
                          << device::to_string(c.current(turn.cls)) << " (ns per KiB moved: plain "
                          << c.estimate(turn.cls, device::StoreKind::plain) << ", streaming "
                          << c.estimate(turn.cls, device::StoreKind::streaming) << ")";
  }
}

}  // namespace smddp
