#include "topology/pci.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>

namespace smddp::topology {

namespace {

std::string read_word(const std::string& path) {
  std::string w;
  std::ifstream(path) >> w;
  return w;
}

std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) out.push_back(path.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// The canonical sysfs path of a PCI device ("/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0"),
// empty if unknown.
std::string canonical(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

}  // namespace

int pci_distance(const std::string& a, const std::string& b) {
  const auto x = components(a), y = components(b);
  size_t common = 0;
  while (common < x.size() && common < y.size() && x[common] == y[common]) ++common;
  return static_cast<int>((x.size() - common) + (y.size() - common));
}

std::vector<std::string> gpus(const std::string& sysfs) {
  const std::string dir = sysfs + "/bus/pci/devices";
  std::vector<std::string> ids;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string id = e->d_name;
      if (id[0] == '.') continue;
      if (read_word(dir + "/" + id + "/vendor") != "0x10de") continue;
      if (read_word(dir + "/" + id + "/class").rfind("0x03", 0) != 0) continue;
      ids.push_back(id);
    }
    ::closedir(d);
  }
  std::sort(ids.begin(), ids.end());  // bus ids sort in bus order: "0000:10:1c.0" < "0000:20:1c.0"
  std::vector<std::string> out;
  for (const auto& id : ids) {
    std::string p = canonical(dir + "/" + id);
    if (!p.empty()) out.push_back(p);
  }
  return out;
}

std::string nic_path(const std::string& sysfs, const std::string& domain) {
  std::string dev = domain;
  for (const char* suffix : {"-rdm", "-dgrm"}) {
    const std::string s = suffix;
    if (dev.size() > s.size() && dev.compare(dev.size() - s.size(), s.size(), s) == 0) dev.resize(dev.size() - s.size());
  }
  return canonical(sysfs + "/class/infiniband/" + dev + "/device");
}

int nearest_rail(const std::string& sysfs, int local_rank, const std::vector<std::string>& rails) {
  const auto g = gpus(sysfs);
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= g.size() || rails.empty()) return -1;
  int best = -1, best_distance = 0;
  for (size_t r = 0; r < rails.size(); ++r) {
    const std::string nic = nic_path(sysfs, rails[r]);
    if (nic.empty()) return -1;
    const int d = pci_distance(g[static_cast<size_t>(local_rank)], nic);
    if (best < 0 || d < best_distance) {
      best = static_cast<int>(r);
      best_distance = d;
    }
  }
  return best;
}

}  // namespace smddp::topology
