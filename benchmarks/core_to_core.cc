// Prints how far apart the first two CPUs are right now, in ns one way (core_to_core.h), for
// benchmarks that cannot run the probe in-process: torch_collectives.py runs it beside each row.
//   core-to-core            one reading
//   core-to-core K          K readings, one per line, 0.5 s apart (to watch the host move the vCPUs)
#include <cstdio>
#include <cstdlib>

#include <chrono>
#include <thread>

#include "core_to_core.h"

int main(int argc, char** argv) {
  const int readings = argc > 1 ? std::atoi(argv[1]) : 1;
  if (readings < 1) {
    std::fprintf(stderr, "usage: core-to-core [READINGS >= 1]\n");
    return 2;
  }
  for (int i = 0; i < readings; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::printf("%.0f\n", smddp::bench::core_to_core_ns());
    std::fflush(stdout);
  }
  return 0;
}
