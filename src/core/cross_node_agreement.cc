#include "core/cross_node_agreement.h"

#include <algorithm>
#include <cstring>

#include "algorithms/net_exchange.h"

namespace smddp::detail {

static_assert(1 + shm::Group::kFingerprintWords <= shm::Group::kWords, "a finding fits a rank's round words");

Finding exchange_fingerprints(algorithms::Context& ctx, const Fingerprint& mine) {
  const std::vector<int> partners = ctx.topo->agreement_partners();
  std::vector<Fingerprint> theirs(partners.size());
  algorithms::NetExchange x(ctx);
  for (size_t i = 0; i < partners.size(); ++i) {
    x.recv(partners[i], theirs[i].data(), sizeof(Fingerprint), algorithms::NetExchange::kAgreementStep);
    x.send(partners[i], mine.data(), sizeof(Fingerprint), algorithms::NetExchange::kAgreementStep);
  }
  x.wait();
  for (size_t i = 0; i < partners.size(); ++i)
    if (theirs[i] != mine) return {partners[i], theirs[i]};
  return {};
}

std::vector<Finding> share_findings(algorithms::Context& ctx, const Finding& mine) {
  shm::Group& shm = ctx.shm;
  // words[0]: the partner's rank + 1 (0: nothing found), words[1..]: its fingerprint.
  const int parity = shm.begin_round();
  uint64_t* w = shm.words(shm.rank(), parity);
  w[0] = static_cast<uint64_t>(mine.rank + 1);
  std::memcpy(&w[1], mine.fp.data(), sizeof(Fingerprint));
  shm.arrive();
  ctx.wait_all();
  std::vector<const uint64_t*> words;
  for (int r = 0; r < shm.size(); ++r) words.push_back(shm.words(r, parity));
  return read_findings(words);
}

std::vector<Finding> read_findings(const std::vector<const uint64_t*>& words) {
  std::vector<Finding> found;
  for (const uint64_t* theirs : words) {
    if (theirs[0] == 0) continue;
    Finding f;
    f.rank = static_cast<int>(theirs[0] - 1);
    std::memcpy(f.fp.data(), &theirs[1], sizeof(Fingerprint));
    const bool seen = std::any_of(found.begin(), found.end(), [&](const Finding& g) { return g.rank == f.rank; });
    if (!seen) found.push_back(f);
  }
  std::sort(found.begin(), found.end(), [](const Finding& a, const Finding& b) { return a.rank < b.rank; });
  return found;
}

}  // namespace smddp::detail
