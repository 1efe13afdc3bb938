// SMDDP_ALGO ("allreduce:one_shot,allgather:hier") and Options::algorithms are user input: any
// text gives a list of algorithms or InvalidArgument, never a crash.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "algorithms/registry.h"
#include "smddp/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto* a : smddp::algorithms::parse_overrides(spec))
      if (!a || !a->run) std::abort();
  } catch (const smddp::InvalidArgument&) {
  }
  return 0;
}
