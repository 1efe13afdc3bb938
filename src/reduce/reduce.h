// CPU reduction kernels: dst[i] = src[0][i] (op) src[1][i] (op) ... (op) src[n-1][i], combined in
// exactly that order (so every rank that reduces the same inputs gets the same bits), then
//  - premul_sum: every input multiplied by `factor` first (in the accumulation type);
//  - avg: the sum divided by `divisor` (the world size) at the end, once.
// dst may alias any source exactly (same address); partial overlap is not allowed.
// The implementation is picked at run time: AVX-512, AVX2 or portable, by CPU features.
#pragma once

#include <cstddef>
#include <string>

#include "smddp/types.h"

namespace smddp::reduce {

struct ReduceArgs {
  void* dst;
  const void* const* srcs;
  int nsrc;
  size_t count;
  DataType dtype;
  Reduction op;
  int divisor = 1;  // avg only
};

void reduce(const ReduceArgs& a);

// True when reduce(a) writes its one source's values unchanged, so a copy may stand in for it
// (the CUDA device's copy engines copy at memory speed, its kernel on a few SMs far slower): one
// source, an op the dtype supports, and nothing scaled (avg by 1, premul_sum by 1 scale nothing).
bool is_copy(const ReduceArgs& a);

// The kernels behind reduce(), one set per instruction set (reduce_kernels.inc, compiled by each
// reduce_<isa>.cc for its target): reduce_dispatch.cc picks one, the tests call each. The AVX
// ones exist on x86-64 only.
#if defined(__x86_64__)
namespace avx512 { void reduce(const ReduceArgs& a); }
namespace avx2 { void reduce(const ReduceArgs& a); }
#endif
namespace scalar { void reduce(const ReduceArgs& a); }

// Name of the implementation in use: "avx512", "avx2" or "scalar" (SMDDP_REDUCE_ISA can force
// a lower one, for benchmarks and tests). Throws InvalidArgument for a bad SMDDP_REDUCE_ISA.
const char* isa();

// The kernels SMDDP_REDUCE_ISA's value `force` ("": the best) picks where the AVX kernels were
// built (x86-64) or not, on a CPU with or without AVX2+FMA and AVX-512F/BW. A value it does not
// know, or one this build or CPU cannot run, is an InvalidArgument naming it, not a quiet fallback.
const char* choose_isa(const std::string& force, bool avx_built, bool has_avx2, bool has_avx512);

}  // namespace smddp::reduce
