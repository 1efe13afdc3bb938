#define SMDDP_ISA_NS scalar
#include "reduce/reduce_kernels.inc"
