#include "topology/topology.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "core/config.h"

namespace smddp::topology {

std::string local_node_key() {
  std::string forced = config::get_string("SMDDP_NODE_ID");
  if (!forced.empty()) return "id:" + forced;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(host) + ":" + boot;
}

int Topology::local_rank() const {
  const auto& l = local_ranks();
  return static_cast<int>(std::find(l.begin(), l.end(), rank) - l.begin());
}

std::vector<int> Topology::peers_across_nodes() const {
  std::vector<int> out;
  const int lr = local_rank();
  for (const auto& n : node_ranks)
    if (lr < static_cast<int>(n.size())) out.push_back(n[static_cast<size_t>(lr)]);
  return out;
}

std::vector<int> Topology::agreement_partners() const {
  std::vector<int> out;
  const size_t lr = static_cast<size_t>(local_rank()), mine = local_ranks().size();
  for (size_t m = 0; m < node_ranks.size(); ++m) {
    if (static_cast<int>(m) == node()) continue;
    const auto& theirs = node_ranks[m];
    for (size_t i = 0; i < theirs.size(); ++i)
      if (i == lr % theirs.size() || i % mine == lr) out.push_back(theirs[i]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Topology::describe() const {
  // Built with a stream: g++ 12 warns (-Wrestrict, a false positive) on chains of string +.
  std::ostringstream os;
  os << num_nodes() << (num_nodes() == 1 ? " node:" : " nodes:");
  for (size_t n = 0; n < node_ranks.size(); ++n) {
    const std::string& key = node_keys[n];
    const bool forced = key.rfind("id:", 0) == 0;
    os << (n ? ", node " : " node ") << n << " (" << (forced ? key.substr(3) : key.substr(0, key.find(':')))
       << ") ranks";
    for (int r : node_ranks[n]) os << ' ' << r;
  }
  return os.str();
}

Topology discover(Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  const std::string mine = local_node_key();
  store.set("topo/node/" + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  Topology t;
  t.rank = rank;
  t.size = size;
  t.node_of.resize(static_cast<size_t>(size));
  std::map<std::string, int> index;
  for (int r = 0; r < size; ++r) {
    auto v = store.get("topo/node/" + std::to_string(r), timeout);
    std::string key(v.begin(), v.end());
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, static_cast<int>(t.node_ranks.size())).first;
      t.node_ranks.emplace_back();
      t.node_keys.push_back(key);
    }
    t.node_of[static_cast<size_t>(r)] = it->second;
    t.node_ranks[static_cast<size_t>(it->second)].push_back(r);
  }
  return t;
}

}  // namespace smddp::topology
