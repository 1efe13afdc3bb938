// Rails: the network interfaces (libfabric domains) a node's ranks spread their traffic over.
// A provider lists one fi_info per domain it can use (an EFA NIC, or for tcp an interface like
// eth0); every rank opens its endpoint on one of them, chosen by its local rank (or, on GPU
// nodes, the NIC nearest its GPU: topology/pci.h), so L ranks on a node with R NICs drive all R
// of them. Pure functions: the endpoint gathers the candidates, these decide
// (tests/unit/rails_test.cc).
#pragma once

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace smddp::ofi {

struct RailCandidate {
  std::string domain;  // libfabric domain name: "rdmap16s27-rdm", "eth0", "lo"
  std::string fabric;  // fabric name: for tcp the subnet ("10.0.0.0/24", "127.0.0.1/32")
};

inline bool is_loopback(const RailCandidate& c) {
  return c.domain == "lo" || c.fabric.rfind("127.", 0) == 0 || c.fabric.rfind("::1", 0) == 0;
}

// How far a tcp-like address reaches, by its subnet (the fabric name): 2 an IPv4 subnet other
// than link-local, 1 a routable IPv6 one, 0 link-local (fe80::/64, 169.254/16: what a bridge or a
// container's veth has in the host's namespace, which no other host can reach).
inline int reach_of_subnet(const std::string& f) {
  if (f.rfind("fe80:", 0) == 0 || f.rfind("169.254.", 0) == 0) return 0;
  return f.find(':') == std::string::npos && f.find('.') != std::string::npos ? 2 : 1;
}
// An interface's: its furthest-reaching address's (those that go away with a container have
// link-local addresses only).
inline int reach_of(const std::vector<RailCandidate>& offered, const std::string& domain) {
  int best = 0;
  for (const auto& c : offered)
    if (c.domain == domain) best = std::max(best, reach_of_subnet(c.fabric));
  return best;
}
// Which of an interface's addresses (their subnets, in libfabric's order) the endpoint opens:
// the first that reaches furthest, so that an interface chosen for its routable address is not
// then opened on its link-local one (libfabric lists fe80:: before fd00:: on one interface).
inline size_t preferred_address(const std::vector<std::string>& subnets) {
  size_t best = 0;
  for (size_t i = 1; i < subnets.size(); ++i)
    if (reach_of_subnet(subnets[i]) > reach_of_subnet(subnets[best])) best = i;
  return best;
}

// The rails to use, each domain once, sorted by name so that every node numbers them alike.
// `wanted` is SMDDP_OFI_RAILS: comma-separated domain names (each must be offered), or "all".
// Without it, providers whose every domain is a NIC on the fabric (efa, verbs: `nics_only`) use
// them all, and the others (tcp, sockets: a host's interfaces include bridges and docker0 that
// reach no other host) use only the first one libfabric offers, as FI_TCP_IFACE steers it, of
// those that reach furthest (reach_of): an interface with an IPv4 address before one with only
// a routable IPv6 one, and both before one with link-local addresses only (libfabric 1.17 lists
// a bridge's and the veths' on it first, so ranks opened their endpoints there, which failed
// with "Cannot assign requested address" when the veths went, or reached no other host); "all"
// takes every interface that reaches furthest alike. Loopback is left out whenever anything
// else is offered: it reaches no other host.
inline std::vector<std::string> choose_rails(const std::vector<RailCandidate>& offered, const std::string& wanted,
                                             bool nics_only, std::string* error) {
  std::vector<std::string> all, real;
  for (const auto& c : offered) {
    if (std::find(all.begin(), all.end(), c.domain) != all.end()) continue;
    all.push_back(c.domain);
    if (!is_loopback(c)) real.push_back(c.domain);
  }
  std::vector<std::string> usable = real.empty() ? all : real;
  if (!nics_only && !real.empty()) {
    int furthest = 0;
    for (const auto& d : usable) furthest = std::max(furthest, reach_of(offered, d));
    usable.erase(std::remove_if(usable.begin(), usable.end(),
                                [&](const std::string& d) { return reach_of(offered, d) < furthest; }),
                 usable.end());
  }
  std::vector<std::string> out;
  if (wanted == "all" || (wanted.empty() && nics_only)) {
    out = usable;
  } else if (wanted.empty()) {
    if (!usable.empty()) out.push_back(usable.front());
  } else {
    std::stringstream ss(wanted);
    std::string name;
    while (std::getline(ss, name, ',')) {
      if (name.empty() || std::find(out.begin(), out.end(), name) != out.end()) continue;
      if (std::find(all.begin(), all.end(), name) == all.end()) {
        if (error) {
          std::string known;
          for (const auto& a : all) known += (known.empty() ? "" : ", ") + a;
          *error = "SMDDP_OFI_RAILS names '" + name + "', which the provider does not offer here (offered: " + known + ")";
        }
        return {};
      }
      out.push_back(name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The rail of the rank with `local_rank` among `n_rails`: round-robin, so consecutive local
// ranks land on different NICs.
inline size_t rail_for(int local_rank, size_t n_rails) {
  return n_rails ? static_cast<size_t>(local_rank) % n_rails : 0;
}

}  // namespace smddp::ofi
