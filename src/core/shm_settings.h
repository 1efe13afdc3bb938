#pragma once

// The node's shared-memory settings (SMDDP_SHM_*, SMDDP_SPIN, SMDDP_MOVE_OFF_SHARED_CPU), read
// and checked once per communicator into the shm::Group's configuration. docs/env-vars.md lists
// them; a value out of range is an InvalidArgument naming the variable.

#include <cstddef>

#include "transport/shm/shm_group.h"

namespace smddp::detail {

// `oversubscribed`: more of the communicator's ranks than cores on this kernel
// (topology::Topology::oversubscribed; the same answer on every rank of a node, so their
// layouts agree). `let_peers_read`: some algorithm of this communicator may read this rank's
// memory by cross-memory attach (algorithms::host_reads_possible). `local_ranks`: the
// communicator's ranks on this node, each with staging slots in the node's segment.
shm::GroupConfig shm_group_config(bool oversubscribed, bool let_peers_read, int local_ranks);

// SMDDP_SHM_CHUNK=auto: the staging chunk's bytes (docs/env-vars.md).
size_t auto_chunk_bytes(bool oversubscribed, int local_ranks);

}  // namespace smddp::detail
