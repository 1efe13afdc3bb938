#define SMDDP_ISA_NS avx512
#include "reduce/reduce_kernels.inc"
