#define SMDDP_ISA_NS avx2
#include "reduce/reduce_kernels.inc"
