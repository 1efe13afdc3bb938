// Fingerprints are read from other processes' shared memory and from the network: any words a
// peer (of another version, or corrupted) wrote must describe to text without a crash.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/fingerprint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using smddp::detail::Fingerprint;
  std::vector<Fingerprint> all(size / sizeof(Fingerprint));
  for (size_t i = 0; i < all.size(); ++i) std::memcpy(all[i].data(), data + i * sizeof(Fingerprint), sizeof(Fingerprint));
  for (const auto& fp : all)
    if (smddp::detail::describe(fp).empty()) std::abort();
  std::vector<int> ranks;
  for (size_t i = 0; i < all.size(); ++i) ranks.push_back(static_cast<int>(i) * 3);
  (void)smddp::detail::describe_disagreement(all, ranks);
  return 0;
}
