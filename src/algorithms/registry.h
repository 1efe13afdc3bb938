// The registry of algorithms and the selector. Every algorithm is listed once in registry.cc;
// the selector picks by collective, message size and world size unless SMDDP_ALGO forces one
// ("allreduce:one_shot,allgather:direct").
#pragma once

#include <string>
#include <vector>

#include "algorithms/algorithm.h"

namespace smddp::algorithms {

const std::vector<Algorithm>& all();
// Throws InvalidArgument for an unknown collective or algorithm name.
const Algorithm& find(CollKind kind, const std::string& name);
// Parses "collective:name,..." (SMDDP_ALGO's syntax); throws InvalidArgument naming a bad entry.
std::vector<const Algorithm*> parse_overrides(const std::string& spec);
// The parsed SMDDP_ALGO overrides (validated on first use).
const std::vector<const Algorithm*>& env_overrides();
// `overrides` first, then SMDDP_ALGO, then the size/topology rules. `bytes`: all ranks' data
// (reduce_scatter's input, allgather's output, allreduce's buffer). `topo` is null inside one
// node; across nodes only algorithms of Scope::nodes qualify (an override that does not fit the
// topology is ignored there). `device_memory`: the buffers are a GPU's (inside a node the
// single-copy window algorithms then win from SMDDP_CUDA_WINDOW_MIN up; docs/gpu.md).
// `own_cpus`: host memory inside one node whose ranks each have a CPU of their own, where
// SMDDP_HOST_WINDOW picks the window algorithms over cross-memory attach in the sizes they win.
const Algorithm& select(CollKind kind, size_t bytes, int world_size,
                        const std::vector<const Algorithm*>& overrides = {},
                        const topology::Topology* topo = nullptr, bool device_memory = false, bool own_cpus = false);

// SMDDP_HOST_WINDOW, parsed (throws InvalidArgument naming a bad value): "auto", "off" or "any".
const std::string& host_window_mode();

// Whether a communicator may read (or write) its node peers' host memory by cross-memory attach
// (the window algorithms on host memory; rounds taken from a late rank, `take_rounds`:
// SMDDP_SHM_STEAL): unless `window_mode` (SMDDP_HOST_WINDOW) is "off", rounds are not taken and
// no override (SMDDP_ALGO's, the communicator's) names a window algorithm. Only then does a rank
// let its peers read it where Yama restricts ptrace (shm::GroupConfig::let_peers_read;
// docs/security.md).
bool host_reads_possible(const std::string& window_mode, bool take_rounds,
                         const std::vector<const Algorithm*>& overrides);

}  // namespace smddp::algorithms
