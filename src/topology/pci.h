// Which NIC sits nearest which GPU, read from sysfs: the PCI tree puts a p4d/p5 node's GPUs and
// EFA NICs under shared PCIe switches, and traffic from a GPU is cheapest through the NIC under
// the same switch (fewest hops up and down the tree). The rank with local rank l drives GPU l
// (torchrun's convention: torch.cuda.set_device(LOCAL_RANK)), and CUDA numbers identical GPUs in
// PCI bus order; so GPU l is the l-th NVIDIA display/3D controller by bus id.
// `sysfs` is "/sys" in production and a made-up tree in tests (tests/unit/pci_test.cc).
#pragma once

#include <string>
#include <vector>

namespace smddp::topology {

// Hops between two devices in the PCI tree: up from one to the common ancestor and down again.
int pci_distance(const std::string& a, const std::string& b);

// NVIDIA GPUs (vendor 0x10de, class display 0x03xxxx) in PCI bus order, as canonical paths.
std::vector<std::string> gpus(const std::string& sysfs);

// The canonical PCI path of an RDMA device named by a libfabric domain ("rdmap16s27-rdm" is
// the verbs device rdmap16s27; "mlx5_0" is itself), empty if sysfs does not know it.
std::string nic_path(const std::string& sysfs, const std::string& domain);

// The index in `rails` (domain names) of the NIC nearest the GPU of `local_rank`, or -1 when
// sysfs cannot tell (no GPU for that rank, or a rail without a PCI device): round-robin then.
int nearest_rail(const std::string& sysfs, int local_rank, const std::vector<std::string>& rails);

}  // namespace smddp::topology
