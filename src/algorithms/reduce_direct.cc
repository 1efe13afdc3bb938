// Reduce to a root: the reduce-scatter half of rs_ag spreads the arithmetic over all ranks,
// then only the root gathers the reduced segments.
#include "algorithms/algorithm.h"

namespace smddp::algorithms {

void reduce_direct(Context& ctx, const CollArgs& a) {
  rs_ag_rounds(ctx, a.send, a.recv, a.count, a.dtype, a.op, a.root);
}

}  // namespace smddp::algorithms
