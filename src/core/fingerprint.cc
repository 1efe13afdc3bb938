#include "core/fingerprint.h"

#include "algorithms/registry.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace smddp::detail {

using algorithms::CollKind;

namespace {
// kWhat packs kind+1 (bits 0-7), dtype (8-15), op+1 (16-23), flags (24-31) and the algorithm's
// place in algorithms::all() + 1 (32-47; 0: none). kSetting: the value of the algorithm's
// Algorithm::setting (0: it has none).
enum Word { kSeq, kWhat, kCount, kRoot, kFactor, kParts, kSetting };
constexpr uint64_t kPerPeerCounts = 1;  // flag: alltoall with per-peer counts
constexpr uint64_t kCudaMemory = 2;     // flag: the buffers are CUDA memory
constexpr uint64_t kBounced = 4;        // flag: across nodes on the GPU, messages bounced (SMDDP_CUDA_NET_BOUNCE)

uint64_t kind_of(const Fingerprint& fp) { return fp[kWhat] & 0xff; }
uint64_t dtype_of(const Fingerprint& fp) { return (fp[kWhat] >> 8) & 0xff; }
uint64_t op_of(const Fingerprint& fp) { return (fp[kWhat] >> 16) & 0xff; }
uint64_t flags_of(const Fingerprint& fp) { return (fp[kWhat] >> 24) & 0xff; }
uint64_t algorithm_of(const Fingerprint& fp) { return (fp[kWhat] >> 32) & 0xffff; }
constexpr uint64_t kAlgorithmBits = uint64_t{0xffff} << 32;

bool has_reduction(CollKind k) {
  return k == CollKind::allreduce || k == CollKind::reduce || k == CollKind::reduce_scatter;
}
bool has_root(CollKind k) {
  return k == CollKind::broadcast || k == CollKind::reduce || k == CollKind::gather || k == CollKind::scatter;
}
}  // namespace

Fingerprint fingerprint(uint64_t coll_seq, const algorithms::CollArgs& a, const algorithms::Algorithm* algorithm,
                        uint64_t piece_elements, bool bounced) {
  static_assert(kSetting < shm::Group::kFingerprintWords);
  Fingerprint fp{};
  fp[kSeq] = coll_seq;
  uint64_t what = static_cast<uint64_t>(a.kind) + 1;  // never zero: an unwritten slot differs
  if (a.kind != CollKind::barrier) {
    what |= static_cast<uint64_t>(a.dtype) << 8;
    if (a.uniform) fp[kCount] = a.count;
    else what |= kPerPeerCounts << 24;
    if (has_reduction(a.kind)) {
      what |= (static_cast<uint64_t>(a.op.op) + 1) << 16;
      if (a.op.op == ReduceOp::premul_sum) std::memcpy(&fp[kFactor], &a.op.factor, sizeof(double));
    }
    if (has_root(a.kind)) fp[kRoot] = static_cast<uint64_t>(a.root);
    else fp[kRoot] = piece_elements;  // a word the kinds without a root leave free
    if (a.memory.kind == Memory::Kind::cuda) what |= kCudaMemory << 24;
    if (bounced) what |= kBounced << 24;
    fp[kParts] = a.parts;
  }
  if (algorithm) {
    what |= static_cast<uint64_t>(algorithm - algorithms::all().data() + 1) << 32;
    if (algorithm->setting_value) fp[kSetting] = algorithm->setting_value();
  }
  fp[kWhat] = what;
  return fp;
}

uint64_t parts_signature(const std::vector<size_t>& parts) {
  if (parts.size() <= 1) return 0;
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the sizes
  for (size_t p : parts)
    for (int b = 0; b < 8; ++b) h = (h ^ ((p >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
  const uint64_t n = std::min<size_t>(parts.size(), 0xffff);
  return (n << 48) | (h & ((uint64_t{1} << 48) - 1));
}

std::string describe(const Fingerprint& fp, bool with_algorithm) {
  if (kind_of(fp) == 0) return "nothing";
  const auto kind = static_cast<CollKind>(kind_of(fp) - 1);
  std::string s = algorithms::to_string(kind);
  s += '(';
  if (kind != CollKind::barrier) {
    s += to_string(static_cast<DataType>(dtype_of(fp)));
    if (flags_of(fp) & kPerPeerCounts) {
      s += ", per-peer counts";
    } else {
      s += ", ";
      s += std::to_string(fp[kCount]);
      s += " elements";
    }
    if (op_of(fp)) {
      const auto op = static_cast<ReduceOp>(op_of(fp) - 1);
      s += ", ";
      s += to_string(op);
      if (op == ReduceOp::premul_sum) {
        double f;
        std::memcpy(&f, &fp[kFactor], sizeof f);
        s += " by ";
        s += std::to_string(f);
      }
    }
    if (has_root(kind)) {
      s += ", root ";
      s += std::to_string(fp[kRoot]);
    } else if (fp[kRoot]) {
      s += ", staged in pieces of " + std::to_string(fp[kRoot]) + " elements a block (SMDDP_CUDA_STAGING_PIECE)";
    }
    if (fp[kParts]) {
      char split[24];
      std::snprintf(split, sizeof split, "%012llx", static_cast<unsigned long long>(fp[kParts] & ((uint64_t{1} << 48) - 1)));
      s += ", in " + std::to_string(fp[kParts] >> 48) + " parts, split #" + split;
    }
    if (flags_of(fp) & kCudaMemory) s += ", CUDA memory";
    if (flags_of(fp) & kBounced) s += ", run on the GPU across nodes (SMDDP_CUDA_NET_BOUNCE=1)";
  }
  s += ") as collective #";
  s += std::to_string(fp[kSeq]);
  const uint64_t algo = algorithm_of(fp);
  const algorithms::Algorithm* a = algo > 0 && algo <= algorithms::all().size() ? &algorithms::all()[algo - 1] : nullptr;
  if (with_algorithm && a) {
    s += " with algorithm ";
    s += a->name;
    if (fp[kSetting] && a->setting) s += std::string(", ") + a->setting + "=" + std::to_string(fp[kSetting]);
  }
  return s;
}

std::string describe_disagreement(const std::vector<Fingerprint>& all, const std::vector<int>& global) {
  // Ranks that agree on everything but the algorithm, or the setting it cuts a collective by,
  // chose them by settings that differ between them: their clauses name both (the others' need
  // not).
  auto without_algorithm = [](Fingerprint fp) {
    fp[kWhat] &= ~kAlgorithmBits;
    fp[kSetting] = 0;
    return fp;
  };
  auto algorithm_differs = [&](size_t i) {
    for (const auto& fp : all)
      if (fp != all[i] && without_algorithm(fp) == without_algorithm(all[i])) return true;
    return false;
  };
  bool named = false;
  std::vector<bool> said(all.size(), false);
  std::string out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (said[i]) continue;
    std::vector<int> ranks;
    for (size_t j = i; j < all.size(); ++j)
      if (!said[j] && all[j] == all[i]) {
        said[j] = true;
        ranks.push_back(j < global.size() ? global[j] : static_cast<int>(j));
      }
    std::string who = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t k = 0; k < ranks.size(); ++k) who += (k ? ", " : "") + std::to_string(ranks[k]);
    const bool with_algorithm = algorithm_differs(i);
    named = named || with_algorithm;
    out += (out.empty() ? "" : "; ") + who + " called " + describe(all[i], with_algorithm);
  }
  if (named)
    out += " (each rank picks the algorithm from its own SMDDP_* settings and Options::algorithms: they must agree)";
  return out;
}

}  // namespace smddp::detail
