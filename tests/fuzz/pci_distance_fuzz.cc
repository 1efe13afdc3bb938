// PCI paths come from sysfs links (/sys/bus/pci/devices/... -> ../../../devices/pci0000:00/...):
// any two strings must give a distance >= 0 without a crash, 0 for a path and itself.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "topology/pci.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t cut = all.find('\n');
  const std::string a = all.substr(0, cut), b = cut == std::string::npos ? a : all.substr(cut + 1);
  if (smddp::topology::pci_distance(a, b) < 0) std::abort();
  if (smddp::topology::pci_distance(a, a) != 0) std::abort();
  return 0;
}
