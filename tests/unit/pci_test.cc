// The NIC nearest each GPU, from a made-up sysfs tree shaped like a p4d node's: GPUs and EFA
// NICs under shared PCIe switches, an NVSwitch bridge that is no GPU, and NIC names whose sorted
// order differs from their placement (so "nearest" and round-robin disagree).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "topology/pci.h"

namespace smddp::topology {
namespace {

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/smddp-sysfs-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    // Switch 10 holds GPU 0 and NIC "rdmap9"; switch 20 holds GPU 1 and NIC "rdmap1".
    device("pci0000:10/0000:10:01.0/0000:11:00.0", "0x10de", "0x030200");  // GPU 0
    device("pci0000:10/0000:10:01.0/0000:11:01.0", "0x1d0f", "0x020000");  // EFA near GPU 0
    device("pci0000:20/0000:20:01.0/0000:21:00.0", "0x10de", "0x030200");  // GPU 1
    device("pci0000:20/0000:20:01.0/0000:21:01.0", "0x1d0f", "0x020000");  // EFA near GPU 1
    device("pci0000:30/0000:30:00.0", "0x10de", "0x068000");                // NVSwitch: no GPU
    nic("rdmap9", "pci0000:10/0000:10:01.0/0000:11:01.0");
    nic("rdmap1", "pci0000:20/0000:20:01.0/0000:21:01.0");
  }
  void TearDown() override { std::system(("rm -rf " + root_).c_str()); }

  void mkdirs(const std::string& path) { std::system(("mkdir -p '" + path + "'").c_str()); }
  void device(const std::string& rel, const std::string& vendor, const std::string& cls) {
    const std::string dir = root_ + "/devices/" + rel;
    mkdirs(dir);
    std::ofstream(dir + "/vendor") << vendor << "\n";
    std::ofstream(dir + "/class") << cls << "\n";
    mkdirs(root_ + "/bus/pci/devices");
    const std::string id = rel.substr(rel.rfind('/') + 1);
    ASSERT_EQ(::symlink(dir.c_str(), (root_ + "/bus/pci/devices/" + id).c_str()), 0);
  }
  void nic(const std::string& name, const std::string& rel) {
    mkdirs(root_ + "/class/infiniband/" + name);
    ASSERT_EQ(::symlink((root_ + "/devices/" + rel).c_str(), (root_ + "/class/infiniband/" + name + "/device").c_str()),
              0);
  }
  std::string root_;
};

TEST(Pci, DistanceCountsHopsThroughTheCommonAncestor) {
  EXPECT_EQ(pci_distance("/sys/devices/pci0000:10/a/b", "/sys/devices/pci0000:10/a/c"), 2);
  EXPECT_EQ(pci_distance("/sys/devices/pci0000:10/a/b", "/sys/devices/pci0000:20/x/y"), 6);
  EXPECT_EQ(pci_distance("/x/y", "/x/y"), 0);
}

TEST_F(FakeSysfs, GpusAreNvidiaDisplayControllersInBusOrder) {
  const auto g = gpus(root_);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_NE(g[0].find("0000:11:00.0"), std::string::npos);
  EXPECT_NE(g[1].find("0000:21:00.0"), std::string::npos);
}

TEST_F(FakeSysfs, EachLocalRankGetsTheNicUnderItsGpusSwitch) {
  const std::vector<std::string> rails = {"rdmap1-rdm", "rdmap9-rdm"};  // sorted, as choose_rails does
  EXPECT_NE(nic_path(root_, "rdmap9-rdm").find("0000:11:01.0"), std::string::npos);
  EXPECT_EQ(nearest_rail(root_, 0, rails), 1);  // GPU 0 -> rdmap9 (round-robin would say 0)
  EXPECT_EQ(nearest_rail(root_, 1, rails), 0);  // GPU 1 -> rdmap1
}

TEST_F(FakeSysfs, UnknownWhenSysfsCannotTell) {
  EXPECT_EQ(nearest_rail(root_, 2, {"rdmap1-rdm", "rdmap9-rdm"}), -1);  // no GPU 2
  EXPECT_EQ(nearest_rail(root_, 0, {"rdmap1-rdm", "eth0"}), -1);        // a rail without a device
  EXPECT_EQ(nearest_rail(root_ + "/nothing", 0, {"rdmap1-rdm"}), -1);   // no sysfs at all
}

}  // namespace
}  // namespace smddp::topology
