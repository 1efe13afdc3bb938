// Across nodes, each rank tells its node in a shared-memory round which partner on another node
// announced a different collective, and what it announced (core/cross_node_agreement.h): round
// words another process wrote. Any words of 1 to 16 local ranks must give findings lowest rank
// first, each rank once, each as the lowest local rank reporting it wrote it, none made up, one
// for every rank reported; and the disagreement they describe must describe without a crash.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef SMDDP_HAVE_LIBFABRIC
#include "core/cross_node_agreement.h"
#endif

// Input: a byte giving the number of local ranks (1 to 16), then each rank's round words
// (Group::kWords x 8 bytes, little-endian; missing bytes are 0).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#ifdef SMDDP_HAVE_LIBFABRIC
  using namespace smddp::detail;
  constexpr size_t kWords = smddp::shm::Group::kWords;
  if (size < 1) return 0;
  const size_t ranks = 1 + (data[0] & 0x0F);
  std::vector<uint64_t> all(ranks * kWords, 0);
  std::memcpy(all.data(), data + 1, std::min(size - 1, all.size() * sizeof(uint64_t)));
  std::vector<const uint64_t*> words;
  for (size_t r = 0; r < ranks; ++r) words.push_back(all.data() + r * kWords);

  const std::vector<Finding> found = read_findings(words);
  if (found.size() > ranks) std::abort();
  for (size_t i = 1; i < found.size(); ++i)
    if (found[i - 1].rank >= found[i].rank) std::abort();  // lowest first, each once
  for (const Finding& f : found) {
    const uint64_t* first = nullptr;  // the lowest local rank that reported f.rank
    for (const uint64_t* w : words)
      if (w[0] != 0 && static_cast<int>(w[0] - 1) == f.rank) {
        first = w;
        break;
      }
    if (!first || std::memcmp(f.fp.data(), first + 1, sizeof(Fingerprint)) != 0) std::abort();
  }
  for (const uint64_t* w : words) {  // every report is among the findings
    if (w[0] == 0) continue;
    bool listed = false;
    for (const Finding& f : found) listed = listed || f.rank == static_cast<int>(w[0] - 1);
    if (!listed) std::abort();
  }
  std::vector<Fingerprint> fps;
  std::vector<int> named;
  for (const Finding& f : found) {
    fps.push_back(f.fp);
    named.push_back(f.rank);
  }
  if (!found.empty() && describe_disagreement(fps, named).empty()) std::abort();
#else
  (void)data;
  (void)size;
#endif
  return 0;
}
