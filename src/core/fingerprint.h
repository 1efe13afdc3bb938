// The fingerprint of a collective: what each rank announces so the ranks can tell, in a round
// they share anyway, that they are running the same collective with the same arguments
// (docs/reliability.md). Building and describing them lives here; comparing is the transport's
// (shm::Group::announce).
#pragma once

#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "transport/shm/shm_group.h"

namespace smddp::detail {

using Fingerprint = shm::Group::Fingerprint;

// Equal on every rank exactly when the ranks agree on the collective's kind, sequence number,
// dtype, count, reduction (op and premul factor), root, kind of memory (host or CUDA) and, for
// coalesced calls, how the count splits into parts. Fields a kind does not use are zero.
// Per-peer counts (alltoallv) are checked by the algorithm itself, pair by pair. `algorithm`:
// the one each rank's selector picked (null: none runs), which ranks whose SMDDP_* settings or
// Options::algorithms differ may not agree on. `piece_elements`: a collective staged in pieces
// (host_staging.h's PipelinedStaging), the elements of each rank's block per piece, which ranks
// whose SMDDP_CUDA_STAGING_PIECE differs do not agree on (0: not cut). `bounced`: CUDA memory
// across nodes runs on the GPU with its network messages bounced (SMDDP_CUDA_NET_BOUNCE) rather
// than on host copies: the node's ranks would otherwise exchange windows of different memory.
Fingerprint fingerprint(uint64_t coll_seq, const algorithms::CollArgs& a,
                        const algorithms::Algorithm* algorithm = nullptr, uint64_t piece_elements = 0,
                        bool bounced = false);

// CollArgs::parts for a coalesced call of these part sizes (0 for a single part).
uint64_t parts_signature(const std::vector<size_t>& parts);

// "allreduce(f32, 16 elements, sum) as collective #3"; `with_algorithm`: then " with algorithm
// rs_ag" too.
std::string describe(const Fingerprint& fp, bool with_algorithm = false);

// One clause per distinct fingerprint, in rank order, naming the (global) ranks that announced
// it: "rank 0 called allreduce(f32, 16 elements, sum); rank 1 called allreduce(f64, ...)". The
// same text on every rank. A clause names the algorithm where another differs from it only
// there. `global[i]` is the communicator rank of local rank i (empty: the local ranks are the
// communicator's).
std::string describe_disagreement(const std::vector<Fingerprint>& all, const std::vector<int>& global);

}  // namespace smddp::detail
