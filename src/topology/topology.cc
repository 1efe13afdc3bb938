#include "topology/topology.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/config.h"
#include "core/failure_record.h"
#include "smddp/errors.h"

namespace smddp::topology {

namespace {

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

std::string boot_id() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  // Unreadable (a sandbox): the host name instead, so that hosts that cannot read theirs are
  // not all counted as one kernel. No spaces: the record is split at them.
  if (boot.empty()) {
    boot = "unknown:" + host_name();
    std::replace(boot.begin(), boot.end(), ' ', '_');
  }
  return boot;
}

std::vector<int> own_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  if (out.empty()) {  // no affinity to read: every online CPU
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < std::max(1L, n); ++c) out.push_back(c);
  }
  return out;
}

// Which /dev/shm this process sees: containers on one kernel with the host's name (docker's
// --network=host, a pod's hostNetwork, as EFA setups run) may each have one of their own, and
// ranks that do not see one /dev/shm cannot share memory. A bind mount of the same one (docker's
// --ipc=host) keeps the underlying device and inode.
std::string dev_shm_id() {
  struct stat st {};
  if (::stat("/dev/shm", &st) != 0) return "none";
  return std::to_string(static_cast<unsigned long long>(st.st_dev)) + "." +
         std::to_string(static_cast<unsigned long long>(st.st_ino));
}

}  // namespace

std::string local_node_key() {
  std::string forced = config::get_string("SMDDP_NODE_ID");
  if (!forced.empty()) return "id:" + forced;
  return host_name() + ":" + boot_id() + ":" + dev_shm_id();
}

std::string cpu_ranges(const std::vector<int>& cpus) {
  std::ostringstream os;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    os << (i ? "," : "") << cpus[i];
    if (j > i) os << '-' << cpus[j];
    i = j + 1;
  }
  return os.str();
}

std::vector<int> parse_cpu_ranges(const std::string& text) {
  std::vector<int> out;
  std::istringstream in(text);
  std::string run;
  while (std::getline(in, run, ',')) {
    const size_t dash = run.find('-');
    try {
      size_t used = 0;
      const int lo = std::stoi(run.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? run.size() : dash)) return {};
      int hi = lo;
      if (dash != std::string::npos) {
        hi = std::stoi(run.substr(dash + 1), &used);
        if (used != run.size() - dash - 1) return {};
      }
      if (lo < 0 || hi < lo || hi >= (1 << 16)) return {};  // CPU ids beyond any machine's: not a set
      for (int c = lo; c <= hi; ++c) out.push_back(c);
    } catch (const std::exception&) {
      return {};
    }
  }
  return out;
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
  os << "; " << kernel_ranks << (kernel_ranks == 1 ? " rank" : " ranks") << " on this kernel sharing " << kernel_cpus
     << (kernel_cpus == 1 ? " CPU" : " CPUs") << (oversubscribed() ? " (oversubscribed)" : "");
  return os.str();
}

namespace {
std::string record_key(int rank) { return "topo/node/" + std::to_string(rank); }
}  // namespace

void publish_setup_failure(Store& store, int rank, const std::string& why) {
  store.set(record_key(rank), failure_record(why));
}

Topology discover(Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  // "<boot id> <cpu ranges> <node key>": the node key last, since SMDDP_NODE_ID may hold spaces.
  const std::string mine = boot_id() + " " + cpu_ranges(own_cpus()) + " " + local_node_key();
  store.set(record_key(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  Topology t;
  t.rank = rank;
  t.size = size;
  t.node_of.resize(static_cast<size_t>(size));
  std::vector<std::string> kernel_of(static_cast<size_t>(size)), cpus_of(static_cast<size_t>(size));
  std::map<std::string, int> index;
  // Every rank's record within one timeout, not one per rank; the ranks that never wrote theirs
  // are named (a store's own timeout names a key, and torch's store raises its own error).
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(record_key(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    std::vector<int> missing;  // (a store that fails here too raises its own error)
    for (int r = 0; r < size; ++r)
      if (!store.check(keys[static_cast<size_t>(r)])) missing.push_back(r);
    if (missing.empty()) throw;
    std::string names;
    for (int r : missing) names += (names.empty() ? "" : ", ") + std::to_string(r);
    throw TimeoutError("smddp: rank " + std::to_string(rank) + " of " + std::to_string(size) + ": timeout after " +
                           std::to_string(timeout.count()) + " ms at construction: rank" +
                           (missing.size() > 1 ? "s " : " ") + names +
                           " did not join (made no communicator of this name from the same store)",
                       missing);
  }
  for (int r = 0; r < size; ++r) {
    auto v = store.get(keys[static_cast<size_t>(r)], timeout);
    if (auto why = failure_in(v))
      throw SystemError("smddp: rank " + std::to_string(rank) + ": rank " + std::to_string(r) +
                        " failed to set up: " + *why);
    const std::string record(v.begin(), v.end());
    const size_t a = record.find(' '), b = a == std::string::npos ? a : record.find(' ', a + 1);
    if (b == std::string::npos)
      throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": rank " + std::to_string(r) +
                  "'s topology record is malformed (a different smddp version?): '" + record + "'");
    kernel_of[static_cast<size_t>(r)] = record.substr(0, a);
    cpus_of[static_cast<size_t>(r)] = record.substr(a + 1, b - a - 1);
    std::string key = record.substr(b + 1);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, static_cast<int>(t.node_ranks.size())).first;
      t.node_ranks.emplace_back();
      t.node_keys.push_back(key);
    }
    t.node_of[static_cast<size_t>(r)] = it->second;
    t.node_ranks[static_cast<size_t>(it->second)].push_back(r);
  }
  // The kernel is the one the node's leader published, not this rank's own reading: every rank
  // of a node then counts the same ranks from the same records (their shared-memory layout
  // depends on it), even if one of them read its boot id differently.
  const std::string& kernel = kernel_of[static_cast<size_t>(t.leader())];
  std::set<int> kernel_cpus;
  t.kernel_ranks = 0;
  for (int r = 0; r < size; ++r) {
    if (kernel_of[static_cast<size_t>(r)] != kernel) continue;
    ++t.kernel_ranks;
    for (int c : parse_cpu_ranges(cpus_of[static_cast<size_t>(r)])) kernel_cpus.insert(c);
  }
  t.kernel_cpus = std::max<int>(1, static_cast<int>(kernel_cpus.size()));
  return t;
}

}  // namespace smddp::topology
