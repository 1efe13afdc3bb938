// What the consistency check (docs/reliability.md) costs the CPU per collective, without the
// machine's core-to-core noise: one rank, one shared-memory round per "collective", with and
// without announcing a fingerprint (built as the communicator builds it, then compared in the
// round's wait). Prints ns per round for each, alternating, a few times. Under
// `valgrind --tool=callgrind` the instruction counts per function are exact and repeatable.
//   consistency-check-cpu [ROUNDS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "core/fingerprint.h"
#include "smddp/store.h"
#include "transport/shm/shm_group.h"

int main(int argc, char** argv) {
  using namespace smddp;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 2000000;
  char tmpl[] = "/tmp/smddp-check-cpu-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  {
    auto store = std::make_shared<FileStore>(dir + "/store");
    shm::Group g(*store, 0, 1, shm::GroupConfig{}, std::chrono::seconds(60));
    algorithms::CollArgs a;
    a.kind = algorithms::CollKind::allreduce;
    a.count = 2;
    OpInfo op;
    op.name = "allreduce";
    op.size = 1;
    op.timeout = std::chrono::hours(1);
    op.deadline = std::chrono::steady_clock::now() + op.timeout;
    for (int pass = 0; pass < 6; ++pass) {
      const bool check = pass % 2 == 1;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < rounds; ++i) {
        if (check) g.announce(detail::fingerprint(static_cast<uint64_t>(i) + 1, a));
        g.begin_round();
        g.arrive();
        g.wait_all(op);
      }
      const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      std::printf("check %s: %.1f ns per collective\n", check ? "on " : "off", ns / rounds);
    }
  }
  std::filesystem::remove_all(dir);
}
