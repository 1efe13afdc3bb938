// The consistency check across nodes (docs/reliability.md). Inside a node the ranks compare
// fingerprints in a shared-memory round; between nodes each rank first swaps fingerprints with
// its agreement partners over the network (Topology::agreement_partners: every rank meets some
// rank of every other node), then tells its own node what it found in that shared-memory round.
// So every rank of every node learns of a disagreement anywhere before any data moves.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/algorithm.h"
#include "core/fingerprint.h"

namespace smddp::detail {

// A partner whose fingerprint differs from this rank's; rank -1: none did.
struct Finding {
  int rank = -1;  // communicator rank
  Fingerprint fp{};
};

// Sends my fingerprint to every agreement partner and receives theirs (one tiny message each
// way per partner, all posted at once); returns the lowest-ranked partner that differs.
// Needs ctx.topo and ctx.net (a communicator spanning nodes).
Finding exchange_fingerprints(algorithms::Context& ctx, const Fingerprint& mine);

// One shared-memory round among this node's ranks in which each publishes its finding (it
// also compares the node's fingerprints, if one was announced: Group::announce). Returns the
// findings of all the node's ranks, lowest rank first, each rank once. A node-mate that failed
// is published before it unwinds (Context::wait_all).
std::vector<Finding> share_findings(algorithms::Context& ctx, const Finding& mine);

// The findings in that round's words, as the node's ranks wrote them (words[r]: local rank r's
// Group::kWords; [0] the partner's rank + 1, 0 for nothing found; [1..] its fingerprint): lowest
// rank first, each rank once, as the lowest local rank that found it reported it.
std::vector<Finding> read_findings(const std::vector<const uint64_t*>& words);

}  // namespace smddp::detail
