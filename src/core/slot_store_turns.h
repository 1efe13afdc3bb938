// A communicator's side of device/slot_stores.h: which class each collective counts in, and what
// its slot writes cost, reported to the chooser and logged.
#pragma once

#include "algorithms/algorithm.h"
#include "device/slot_stores.h"

namespace smddp {

// The store kind for collective `a` of a communicator of `size` ranks (its class: the kind, and
// the message size as every rank sees it, so that every rank counts the same collectives).
device::StoreKindChooser::Turn begin_slot_stores(device::StoreKindChooser& c, const algorithms::CollArgs& a,
                                                 int size);
// Tells `c` what that collective's slot writes cost (device `d`); logs a change of kind (INFO)
// and each probe (TRACE).
void end_slot_stores(device::StoreKindChooser& c, device::StoreKindChooser::Turn turn,
                     const device::SlotStoreDevice& d, int rank);

}  // namespace smddp
