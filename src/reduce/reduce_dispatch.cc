// Picks the reduction kernels for this CPU once, then forwards every call.
#include <string>

#include "core/config.h"
#include "reduce/reduce.h"
#include "smddp/errors.h"

namespace smddp::reduce {

const char* choose_isa(const std::string& force, bool avx_built, bool has_avx2, bool has_avx512) {
  const std::string what = "smddp: SMDDP_REDUCE_ISA is '" + force + "'";
  if (force == "scalar") return "scalar";
  if (force == "avx512" || force == "avx2") {
    if (!avx_built)
      throw InvalidArgument(what + ", but this build has only the portable kernels (the AVX ones are built for x86-64 "
                                   "alone); unset it or set scalar");
    if (force == "avx512" && !has_avx512)
      throw InvalidArgument(what + ", but this CPU lacks AVX-512F/BW; unset it for the best this CPU has");
    if (force == "avx2" && !has_avx2)
      throw InvalidArgument(what + ", but this CPU lacks AVX2/FMA; unset it for the best this CPU has");
    return force == "avx512" ? "avx512" : "avx2";
  }
  if (!force.empty()) throw InvalidArgument(what + "; known: avx512, avx2, scalar");
  return has_avx512 ? "avx512" : has_avx2 ? "avx2" : "scalar";
}

bool is_copy(const ReduceArgs& a) {
  if (a.nsrc != 1 || !supports(a.dtype, a.op.op)) return false;
  if (a.op.op == ReduceOp::avg) return a.divisor == 1;
  if (a.op.op == ReduceOp::premul_sum) return a.op.factor == 1.0;
  return true;
}

namespace {
struct Choice {
  void (*fn)(const ReduceArgs&);
  const char* name;
};

// Scalar everywhere; the AVX kernels only where they were built and the CPU runs them.
Choice choose() {
  bool avx2_ok = false, avx512_ok = false, built = false;
#if defined(__x86_64__)
  __builtin_cpu_init();
  built = true;
  avx512_ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  avx2_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  const std::string name = choose_isa(config::get_string("SMDDP_REDUCE_ISA"), built, avx2_ok, avx512_ok);
#if defined(__x86_64__)
  if (name == "avx512") return {avx512::reduce, "avx512"};
  if (name == "avx2") return {avx2::reduce, "avx2"};
#endif
  return {scalar::reduce, "scalar"};  // elsewhere the compiler's vectors for the target's baseline
}

const Choice& choice() {
  static const Choice c = choose();
  return c;
}
}  // namespace

void reduce(const ReduceArgs& a) {
  if (a.count == 0) return;
  if (!supports(a.dtype, a.op.op))
    throw InvalidArgument(std::string("smddp: reduction ") + to_string(a.op.op) + " is not defined for " +
                          to_string(a.dtype));
  choice().fn(a);
}

const char* isa() { return choice().name; }

}  // namespace smddp::reduce
