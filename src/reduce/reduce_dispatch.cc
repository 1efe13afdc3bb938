// Picks the reduction kernels for this CPU once, then forwards every call.
#include <string>

#include "core/config.h"
#include "reduce/reduce.h"
#include "smddp/errors.h"

namespace smddp::reduce {
#if defined(__x86_64__)
namespace avx512 { void reduce(const ReduceArgs& a); }
namespace avx2 { void reduce(const ReduceArgs& a); }
#endif
namespace scalar { void reduce(const ReduceArgs& a); }

namespace {
struct Choice {
  void (*fn)(const ReduceArgs&);
  const char* name;
};

Choice choose() {
  std::string force = config::get_string("SMDDP_REDUCE_ISA");
  if (force == "scalar") return {scalar::reduce, "scalar"};
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (force == "avx2" && has2) return {avx2::reduce, "avx2"};
  if (has512 && (force.empty() || force == "avx512")) return {avx512::reduce, "avx512"};
  if (has2) return {avx2::reduce, "avx2"};
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
