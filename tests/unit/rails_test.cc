// Which libfabric domains become rails, and which rail each local rank drives.
#include <gtest/gtest.h>

#include "transport/ofi/rails.h"

namespace smddp::ofi {
namespace {

const std::vector<RailCandidate> kTcp = {
    {"eth1", "10.1.2.0/24"}, {"eth1", "fe80::/64"}, {"lo", "127.0.0.1/32"}, {"eth0", "10.1.1.0/24"},
    {"lo", "::1/128"},       {"eth0", "fe80::/64"},
};

TEST(Rails, TcpUsesLibfabricsFirstInterfaceUnlessAskedForMore) {
  std::string err;
  EXPECT_EQ(choose_rails(kTcp, "", false, &err), (std::vector<std::string>{"eth1"}));
  EXPECT_EQ(choose_rails(kTcp, "all", false, &err), (std::vector<std::string>{"eth0", "eth1"}));
  EXPECT_TRUE(err.empty());
}

// A bridge and veths (a container's, or tools/netns's) carry link-local addresses only, and
// libfabric lists them first: the interface with a routable address is chosen, IPv4 first.
TEST(Rails, TcpPassesOverInterfacesWithLinkLocalAddressesOnly) {
  std::string err;
  const std::vector<RailCandidate> host = {
      {"veth1", "fe80::/64"},   {"br0", "fe80::/64"},    {"veth2", "169.254.0.0/16"}, {"eth0", "192.0.2.0/24"},
      {"eth0", "fe80::/64"},    {"eth0", "fd00::/64"},   {"eth1", "fd01::/64"},         {"lo", "127.0.0.1/32"},
      {"veth1", "fe80::/64"},
  };
  EXPECT_EQ(choose_rails(host, "", false, &err), (std::vector<std::string>{"eth0"}));
  EXPECT_EQ(choose_rails(host, "all", false, &err), (std::vector<std::string>{"eth0"}));
  // Only IPv6 beyond link-local: that one; only link-local: the first, as before.
  EXPECT_EQ(choose_rails({{"veth1", "fe80::/64"}, {"eth1", "fd01::/64"}}, "", false, &err),
            (std::vector<std::string>{"eth1"}));
  EXPECT_EQ(choose_rails({{"veth1", "fe80::/64"}, {"veth2", "fe80::/64"}, {"lo", "127.0.0.1/32"}}, "", false, &err),
            (std::vector<std::string>{"veth1"}));
  // Asked for by name, any interface is taken.
  EXPECT_EQ(choose_rails(host, "veth1", false, &err), (std::vector<std::string>{"veth1"}));
  EXPECT_TRUE(err.empty());
}

// The chosen interface's endpoint opens on the address that made it the choice, not on the
// first libfabric lists (fe80:: comes before fd00:: on one interface; a 169.254 address may come
// before the routable IPv4 one). Non-IP fabric names (efa's) all rank alike: the first.
TEST(Rails, TheEndpointOpensOnTheInterfacesFurthestReachingAddress) {
  EXPECT_EQ(preferred_address({"fe80::/64", "fd01::/64"}), 1u);
  EXPECT_EQ(preferred_address({"169.254.0.0/16", "10.0.0.0/24", "fe80::/64"}), 1u);
  EXPECT_EQ(preferred_address({"192.0.2.0/24", "fe80::/64", "fd00::/64"}), 0u);
  EXPECT_EQ(preferred_address({"fd00::/64", "192.0.2.0/24"}), 1u);
  EXPECT_EQ(preferred_address({"fe80::/64"}), 0u);
  EXPECT_EQ(preferred_address({"efa", "efa"}), 0u);
}

TEST(Rails, LoopbackOnlyWhenNothingElse) {
  std::string err;
  const std::vector<RailCandidate> lo = {{"lo", "127.0.0.1/32"}, {"lo", "::1/128"}};
  EXPECT_EQ(choose_rails(lo, "", false, &err), (std::vector<std::string>{"lo"}));
  EXPECT_EQ(choose_rails(lo, "all", false, &err), (std::vector<std::string>{"lo"}));
  EXPECT_EQ(choose_rails({{"lo", "127.0.0.1/32"}, {"eth0", "10.0.0.0/8"}}, "", false, &err),
            (std::vector<std::string>{"eth0"}));
}

TEST(Rails, EfaNicsAreRails) {
  std::string err;
  const std::vector<RailCandidate> efa = {{"rdmap79s0-rdm", "efa"}, {"rdmap16s27-rdm", "efa"}, {"rdmap32s0-rdm", "efa"}};
  EXPECT_EQ(choose_rails(efa, "", true, &err), (std::vector<std::string>{"rdmap16s27-rdm", "rdmap32s0-rdm", "rdmap79s0-rdm"}));
}

TEST(Rails, WantedRestrictsAndUnknownNamesAreAnError) {
  std::string err;
  EXPECT_EQ(choose_rails(kTcp, "eth1,eth1", false, &err), (std::vector<std::string>{"eth1"}));
  EXPECT_EQ(choose_rails(kTcp, "lo", false, &err), (std::vector<std::string>{"lo"}));
  EXPECT_EQ(choose_rails(kTcp, "eth1,eth0", true, &err), (std::vector<std::string>{"eth0", "eth1"}));
  EXPECT_TRUE(choose_rails(kTcp, "eth0,ib0", false, &err).empty());
  EXPECT_NE(err.find("'ib0'"), std::string::npos) << err;
  EXPECT_NE(err.find("offered: eth1, lo, eth0"), std::string::npos) << err;  // names what is offered
}

TEST(Rails, LocalRanksRoundRobin) {
  EXPECT_EQ(rail_for(0, 2), 0u);
  EXPECT_EQ(rail_for(1, 2), 1u);
  EXPECT_EQ(rail_for(2, 2), 0u);
  EXPECT_EQ(rail_for(5, 4), 1u);
  EXPECT_EQ(rail_for(3, 1), 0u);
}

}  // namespace
}  // namespace smddp::ofi
