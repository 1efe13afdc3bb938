// Records other ranks put in the Store, read back by every rank: the node keys the topology is
// built from (any bytes, any number of ranks and nodes), a peer's libfabric address, and the
// libfabric job token. A rank of
// another version, or a corrupted Store, must give a topology that describes and pairs without a
// crash, or an InvalidArgument naming the record (a SystemError naming the rank for a record
// that says its rank failed to set up); never anything else.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "smddp/errors.h"
#include "smddp/store.h"
#include "topology/topology.h"
#ifdef SMDDP_HAVE_LIBFABRIC
#include "transport/ofi/job_key.h"
#include "transport/ofi/wire.h"
#endif

namespace {

// What the records look like to a rank: a map, as FileStore keeps them (one file per key).
class MapStore : public smddp::Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override { kv_[key] = value; }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds) override {
    auto it = kv_.find(key);
    if (it == kv_.end()) throw smddp::TimeoutError("fuzz store: no " + key, {});
    return it->second;
  }
  int64_t add(const std::string&, int64_t delta) override { return delta; }
  void wait(const std::vector<std::string>&, std::chrono::milliseconds) override {}
  bool check(const std::string& key) override { return kv_.count(key) != 0; }

 private:
  std::map<std::string, std::vector<uint8_t>> kv_;
};

}  // namespace

// Input: a byte giving the world size (1..16) and this rank, then one record per other rank,
// each a length byte and that many bytes; then a peer's address record (a byte giving this
// rank's own address length, a length byte and that many bytes); what is left is the job token.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int world = 1 + (data[0] & 0x0F);
  const int rank = (data[0] >> 4) % world;
  size_t at = 1;
  MapStore store;
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;  // discover writes this rank's own
    size_t n = at < size ? data[at++] : 0;
    n = std::min(n, size - at);
    store.set("topo/node/" + std::to_string(r), std::vector<uint8_t>(data + at, data + at + n));
    at += n;
  }
  smddp::topology::Topology t;
  try {
    t = smddp::topology::discover(store, rank, world, std::chrono::milliseconds(0));
  } catch (const smddp::InvalidArgument& e) {
    // A record without its "<kernel> <cpus> " head (another version's): named, not guessed at.
    if (std::string(e.what()).find("topology record is malformed") == std::string::npos) std::abort();
    return 0;
  } catch (const smddp::SystemError& e) {
    // A record that says its rank failed (failure_record.h): that rank named with its reason.
    if (std::string(e.what()).find(" failed to set up: ") == std::string::npos) std::abort();
    return 0;
  }
  if (t.kernel_ranks < 1 || t.kernel_cpus < 1) std::abort();
  if (t.describe().empty() || t.local_size() < 1 || t.leader() > rank) std::abort();
  for (int p : t.agreement_partners())
    if (p < 0 || p >= world || t.node_of[static_cast<size_t>(p)] == t.node()) std::abort();
  for (int p : t.peers_across_nodes())
    if (p < 0 || p >= world) std::abort();
  (void)t.local_rank();
#ifdef SMDDP_HAVE_LIBFABRIC
  {
    const size_t own = at < size ? data[at++] : 0;
    size_t n = at < size ? data[at++] : 0;
    n = std::min(n, size - at);
    const std::vector<uint8_t> addr(data + at, data + at + n);
    at += n;
    // Taken exactly when fi_av_insert may read it whole: the length of this rank's own address.
    if (smddp::ofi::address_record_problem(addr.size(), own).empty() != (addr.size() == own)) std::abort();
    // The settings after an address: read back as written, and refused exactly when they differ.
    if (addr.size() >= smddp::ofi::kWireSettingsBytes) {
      const auto theirs = smddp::ofi::wire_settings_of(addr);
      std::vector<uint8_t> again(addr.begin(), addr.end() - smddp::ofi::kWireSettingsBytes);
      smddp::ofi::append_wire_settings(again, theirs);
      if (again != addr) std::abort();
      const smddp::ofi::WireSettings ours{theirs.max_msg, theirs.rma_min ^ (own & 1)};
      if (smddp::ofi::wire_settings_problem(theirs, ours).empty() != ((own & 1) == 0)) std::abort();
    }
  }
  try {
    (void)smddp::ofi::job_key(std::vector<uint8_t>(data + at, data + size));
    if (size - at != smddp::ofi::kJobTokenBytes) std::abort();  // a record of another size was taken
  } catch (const smddp::InvalidArgument&) {
    if (size - at == smddp::ofi::kJobTokenBytes) std::abort();
  }
#endif
  return 0;
}
