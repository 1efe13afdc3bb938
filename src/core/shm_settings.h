#pragma once

// The node's shared-memory settings (SMDDP_SHM_*, SMDDP_SPIN, SMDDP_MOVE_OFF_SHARED_CPU), read
// and checked once per communicator into the shm::Group's configuration. docs/env-vars.md lists
// them; a value out of range is an InvalidArgument naming the variable.

#include "transport/shm/shm_group.h"

namespace smddp::detail {

// `oversubscribed`: more of the communicator's ranks than cores on this kernel
// (topology::Topology::oversubscribed; the same answer on every rank of a node, so their
// layouts agree). `let_peers_read`: some algorithm of this communicator may read this rank's
// memory by cross-memory attach (algorithms::host_reads_possible).
shm::GroupConfig shm_group_config(bool oversubscribed, bool let_peers_read);

}  // namespace smddp::detail
