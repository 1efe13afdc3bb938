// Which ranks share a node. Every rank publishes a node key through the Store (SMDDP_NODE_ID if
// set, for tests and containers; else hostname + kernel boot id, so two containers on one host
// with different host names are still one node only if they say so) and reads everyone's.
// Nodes are numbered in order of their lowest rank; a node's leader is its lowest rank.
//
// Beside it each rank publishes its kernel (boot id) and the CPUs it may run on, so a rank knows
// how many of the communicator's ranks compete for the same cores. That is not the node's size:
// pretend nodes (SMDDP_NODE_ID, network namespaces, containers of one job on one machine) share
// a kernel and its cores. Every rank of a node reads the same answer, since a node's ranks share
// one kernel.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "smddp/store.h"

namespace smddp::topology {

struct Topology {
  int rank = 0;
  int size = 1;
  std::vector<int> node_of;                 // node index of every rank
  std::vector<std::vector<int>> node_ranks; // ranks of every node, ascending
  std::vector<std::string> node_keys;       // what identified each node
  int kernel_ranks = 1;  // ranks of the communicator on this rank's kernel (any node)
  int kernel_cpus = 1;   // CPUs those ranks may run on, all together (union of their affinities)

  int node() const { return node_of[static_cast<size_t>(rank)]; }
  int num_nodes() const { return static_cast<int>(node_ranks.size()); }
  const std::vector<int>& local_ranks() const { return node_ranks[static_cast<size_t>(node())]; }
  int local_size() const { return static_cast<int>(local_ranks().size()); }
  int local_rank() const;
  int leader() const { return local_ranks().front(); }
  // The ranks with my local rank on every node (one per node that has that many ranks).
  std::vector<int> peers_across_nodes() const;
  // The ranks on other nodes I exchange fingerprints with (cross-node agreement, see
  // docs/reliability.md): on every other node m, the rank whose local rank is mine mod m's size,
  // and each rank of m whose local rank mod my node's size is mine. The pairing is symmetric (b
  // is among a's exactly when a is among b's) and pairs every rank with at least one rank of
  // every other node, so a node whose ranks agree among themselves hears of any rank elsewhere
  // that differs. Ascending.
  std::vector<int> agreement_partners() const;
  // More ranks than cores on this kernel: a waiting rank's spin takes the core of the rank it
  // waits for, so waits yield and rounds are fewer and larger.
  bool oversubscribed() const { return kernel_ranks > kernel_cpus; }
  // "2 nodes: node 0 (vm) ranks 0-1, node 1 (vm2) ranks 2-3" for the INFO log.
  std::string describe() const;
};

// This process's node key (SMDDP_NODE_ID or hostname:boot-id).
std::string local_node_key();

// The CPUs this process may run on as ranges ("0-3,8"), and back (malformed text: empty).
std::string cpu_ranges(const std::vector<int>& cpus);
std::vector<int> parse_cpu_ranges(const std::string& text);

// Collective over all ranks of the store's group. A rank that published a failure instead of
// its record (publish_setup_failure) fails every other rank's discover with its reason.
Topology discover(Store& store, int rank, int size, std::chrono::milliseconds timeout);

// For a rank that fails before discover (a setting it refuses): publishes `why` where the
// others wait for its record, so that they fail at once with it, not time out saying it did not
// join.
void publish_setup_failure(Store& store, int rank, const std::string& why);

}  // namespace smddp::topology
