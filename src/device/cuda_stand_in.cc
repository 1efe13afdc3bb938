// The stand-in for CUDA that device/cuda.h's tests set; both builds (with CUDA and without) ask it first.
#include "device/cuda.h"

namespace smddp::device {

namespace {
CudaStandIn& stand_in() {
  static CudaStandIn s;
  return s;
}
}  // namespace

void set_cuda_stand_in(CudaStandIn make) { stand_in() = std::move(make); }
const CudaStandIn& cuda_stand_in() { return stand_in(); }

}  // namespace smddp::device
