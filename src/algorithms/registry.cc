#include "algorithms/registry.h"

#include <algorithm>
#include <sstream>
#include <string_view>

#include "core/config.h"
#include "device/host_copy.h"
#include "smddp/errors.h"

namespace smddp::algorithms {

void allreduce_one_shot(Context&, const CollArgs&);
void allreduce_rs_ag(Context&, const CollArgs&);
void allreduce_window(Context&, const CollArgs&);
void allgather_direct(Context&, const CollArgs&);
void allgather_window(Context&, const CollArgs&);
void reduce_scatter_direct(Context&, const CollArgs&);
void reduce_scatter_window(Context&, const CollArgs&);
void broadcast_direct(Context&, const CollArgs&);
void reduce_direct(Context&, const CollArgs&);
void gather_direct(Context&, const CollArgs&);
void scatter_direct(Context&, const CollArgs&);
void alltoall_direct(Context&, const CollArgs&);
void barrier_flags(Context&, const CollArgs&);
#ifdef SMDDP_HAVE_LIBFABRIC
void allreduce_hier(Context&, const CollArgs&);
void allreduce_hier_small(Context&, const CollArgs&);
void allgather_hier(Context&, const CollArgs&);
void reduce_scatter_hier(Context&, const CollArgs&);
size_t hier_slice_bytes();
void allreduce_net_direct(Context&, const CollArgs&);
void allgather_net_direct(Context&, const CollArgs&);
void reduce_scatter_net_direct(Context&, const CollArgs&);
void broadcast_net_direct(Context&, const CollArgs&);
void reduce_net_direct(Context&, const CollArgs&);
void gather_net_direct(Context&, const CollArgs&);
void scatter_net_direct(Context&, const CollArgs&);
void alltoall_net_direct(Context&, const CollArgs&);
void barrier_net_direct(Context&, const CollArgs&);
#endif

const char* to_string(CollKind k) {
  switch (k) {
    case CollKind::allreduce: return "allreduce";
    case CollKind::allgather: return "allgather";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::broadcast: return "broadcast";
    case CollKind::reduce: return "reduce";
    case CollKind::gather: return "gather";
    case CollKind::scatter: return "scatter";
    case CollKind::alltoall: return "alltoall";
    case CollKind::barrier: return "barrier";
  }
  return "?";
}

const std::vector<Algorithm>& all() {
  static const std::vector<Algorithm> list = {
      {CollKind::allreduce, "one_shot", allreduce_one_shot},
      {CollKind::allreduce, "rs_ag", allreduce_rs_ag},
      {CollKind::allreduce, "window", allreduce_window},
      {CollKind::allgather, "direct", allgather_direct},
      {CollKind::allgather, "window", allgather_window},
      {CollKind::reduce_scatter, "direct", reduce_scatter_direct},
      {CollKind::reduce_scatter, "window", reduce_scatter_window},
      {CollKind::broadcast, "direct", broadcast_direct},
      {CollKind::reduce, "direct", reduce_direct},
      {CollKind::gather, "direct", gather_direct},
      {CollKind::scatter, "direct", scatter_direct},
      {CollKind::alltoall, "direct", alltoall_direct},
      {CollKind::barrier, "flags", barrier_flags},
#ifdef SMDDP_HAVE_LIBFABRIC
      // Across nodes (libfabric between them, shared memory inside):
      {CollKind::allreduce, "hier", allreduce_hier, Scope::nodes, /*even_nodes=*/true, "SMDDP_HIER_SLICE",
       hier_slice_bytes},
      {CollKind::allreduce, "hier_small", allreduce_hier_small, Scope::nodes, /*even_nodes=*/true},
      {CollKind::allgather, "hier", allgather_hier, Scope::nodes, /*even_nodes=*/true},
      {CollKind::reduce_scatter, "hier", reduce_scatter_hier, Scope::nodes, /*even_nodes=*/true, "SMDDP_HIER_SLICE",
       hier_slice_bytes},
      {CollKind::allreduce, "net_direct", allreduce_net_direct, Scope::nodes},
      {CollKind::allgather, "net_direct", allgather_net_direct, Scope::nodes},
      {CollKind::reduce_scatter, "net_direct", reduce_scatter_net_direct, Scope::nodes},
      {CollKind::broadcast, "net_direct", broadcast_net_direct, Scope::nodes},
      {CollKind::reduce, "net_direct", reduce_net_direct, Scope::nodes},
      {CollKind::gather, "net_direct", gather_net_direct, Scope::nodes},
      {CollKind::scatter, "net_direct", scatter_net_direct, Scope::nodes},
      {CollKind::alltoall, "net_direct", alltoall_net_direct, Scope::nodes},
      {CollKind::barrier, "net_direct", barrier_net_direct, Scope::nodes},
#endif
  };
  return list;
}

const Algorithm& find(CollKind kind, const std::string& name) {
  std::string known;
  for (const auto& a : all()) {
    if (a.kind != kind) continue;
    if (name == a.name) return a;
    known += (known.empty() ? "" : ", ") + std::string(a.name);
  }
  throw InvalidArgument("smddp: no " + std::string(to_string(kind)) + " algorithm named '" + name +
                        "' (known: " + known + ")");
}

std::vector<const Algorithm*> parse_overrides(const std::string& spec) {
    std::vector<const Algorithm*> v;
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) continue;
      auto colon = item.find(':');
      if (colon == std::string::npos)
        throw InvalidArgument("smddp: SMDDP_ALGO entry '" + item + "' is not COLLECTIVE:ALGORITHM");
      std::string coll = item.substr(0, colon), name = item.substr(colon + 1);
      bool matched = false;
      for (int k = 0; k < kNumCollKinds; ++k) {
        if (coll == to_string(static_cast<CollKind>(k))) {
          v.push_back(&find(static_cast<CollKind>(k), name));
          matched = true;
        }
      }
      if (!matched) throw InvalidArgument("smddp: SMDDP_ALGO names unknown collective '" + coll + "'");
    }
    return v;
}

const std::vector<const Algorithm*>& env_overrides() {
  static const std::vector<const Algorithm*> list = parse_overrides(config::get_string("SMDDP_ALGO"));
  return list;
}

const std::string& host_window_mode() {
  static const std::string mode = [] {
    std::string m = config::get_string("SMDDP_HOST_WINDOW");
    if (m != "auto" && m != "off" && m != "any")
      throw InvalidArgument("smddp: SMDDP_HOST_WINDOW is '" + m + "'; known: auto, off, any");
    return m;
  }();
  return mode;
}

bool host_reads_possible(const std::string& window_mode, bool take_rounds,
                         const std::vector<const Algorithm*>& overrides) {
  if (window_mode != "off" || take_rounds) return true;
  return std::any_of(overrides.begin(), overrides.end(),
                     [](const Algorithm* a) { return std::string_view(a->name) == "window"; });
}

namespace {

// Host memory, one node, a CPU per rank: the sizes in which the single-copy algorithms over
// cross-memory attach beat the staged ones through torch at w=2 (docs/algorithms.md, "The
// single-copy algorithms"): one copy per byte where staging makes two, and fewer rounds. Below,
// their rounds (two for the allreduce, which writes its peers' outputs) cost more than the copy
// saves; above, both are bound by memory, and the kernel pins every page it copies. With more
// ranks than cores they lose (a read is a system call that cannot hand the core to the rank it
// waits for). Since the staging chunk is 1 MiB the staged ones are faster in these bands when
// the two cores share a cache, but were 4-5x slower when they do not, where these are not
// (docs/performance.md, "Rewriting lines a peer still caches"). With the slot stores chosen by
// measurement (device/slot_stores.h) the staged reduce_scatter beats this one on both
// placements, through torch, beside busy processes too, so it has no band where those stores
// are built (x86-64); the staged
// allreduce and allgather still lose at some sizes when the cores do not share a cache.
// `bytes` as select() takes them.
bool host_window_wins(CollKind kind, size_t bytes, int world_size) {
  const std::string& mode = host_window_mode();
  if (mode == "off" || world_size < 2 || (mode == "auto" && world_size != 2)) return false;
  constexpr size_t KiB = 1024, MiB = 1024 * KiB;
  switch (kind) {
    case CollKind::allreduce: return bytes >= 1 * MiB && bytes <= 16 * MiB;
    // Without non-temporal stores (off x86-64) the staged one keeps plain stores, measured
    // 4-5x slower than this one on the far placement.
    case CollKind::reduce_scatter: return !device::streaming_stores_built() && bytes >= 1 * MiB && bytes <= 16 * MiB;
    case CollKind::allgather: return bytes >= 256 * KiB && bytes <= 32 * MiB;
    default: return false;
  }
}

}  // namespace

const Algorithm& select(CollKind kind, size_t bytes, int world_size, const std::vector<const Algorithm*>& overrides,
                        const topology::Topology* topo, bool device_memory, bool own_cpus) {
  const Scope scope = topo && topo->num_nodes() > 1 ? Scope::nodes : Scope::node;
  // The hierarchical algorithms need the same number of ranks on every node; forced elsewhere,
  // they read peers that do not exist (an override that does not fit is ignored, as documented).
  bool even = true;
  if (scope == Scope::nodes)
    for (const auto& n : topo->node_ranks) even = even && n.size() == topo->node_ranks[0].size();
  auto fits = [&](const Algorithm* a) { return a->kind == kind && a->scope == scope && (even || !a->even_nodes); };
  for (const Algorithm* a : overrides)
    if (fits(a)) return *a;
  for (const Algorithm* a : env_overrides())
    if (fits(a)) return *a;
  if (scope == Scope::nodes) {
    if (even && kind == CollKind::allreduce) {
      static const size_t small_max = static_cast<size_t>(config::get_int("SMDDP_HIER_SMALL_MAX"));
      return find(kind, bytes <= small_max ? "hier_small" : "hier");
    }
    if (even && (kind == CollKind::allgather || kind == CollKind::reduce_scatter)) return find(kind, "hier");
    return find(kind, "net_direct");
  }
  if (device_memory && (kind == CollKind::allreduce || kind == CollKind::allgather ||
                        kind == CollKind::reduce_scatter)) {
    // GPU buffers: the staged algorithms move every byte through host memory (over PCIe, and
    // reduce on the CPU); the window algorithms read the peers' buffers through CUDA IPC, one
    // copy on the copy engines or one kernel. Below the limit the staged ones' fewer
    // synchronisations win (measured on an H100, docs/gpu.md); alone, a rank only copies.
    static const size_t window_min = static_cast<size_t>(config::get_int("SMDDP_CUDA_WINDOW_MIN"));
    if (world_size == 1 || bytes >= window_min) return find(kind, "window");
  }
  if (own_cpus && !device_memory && host_window_wins(kind, bytes, world_size)) return find(kind, "window");
  if (kind == CollKind::allreduce) {
    // One round trip through shared memory wins while every rank reducing every input is cheaper
    // than a second synchronisation (docs/algorithms.md has the measurements behind the limit).
    static const size_t one_shot_max = static_cast<size_t>(config::get_int("SMDDP_ONE_SHOT_MAX"));
    return find(kind, bytes <= one_shot_max || world_size == 1 ? "one_shot" : "rs_ag");
  }
  for (const auto& a : all())
    if (a.kind == kind) return a;
  throw InvalidArgument("smddp: no algorithm for " + std::string(to_string(kind)));
}

}  // namespace smddp::algorithms
