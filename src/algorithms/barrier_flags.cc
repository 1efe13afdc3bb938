// Barrier: one round of the step counters, no data.
#include "algorithms/algorithm.h"

namespace smddp::algorithms {

void barrier_flags(Context& ctx, const CollArgs&) {
  ctx.shm.begin_round();
  ctx.arrive();
  ctx.wait_all();
}

}  // namespace smddp::algorithms
