// The smddp._C extension module: the backend creator and what `python -m smddp.info` shows.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include "backend.h"
#include "core/config.h"
#include "reduce/reduce.h"
#include "topology/topology.h"
#include "smddp/version.h"
#include "torch_compat.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "smddp: topology-aware collectives for PyTorch (native part)";
  m.attr("__version__") = smddp::version();
  m.attr("torch_version_built") = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  m.def("create_backend", &smddp::torch_backend::ProcessGroupSmddp::create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::arg("local_rank") = -1,
        "Creates the smddp c10d backend (called by torch.distributed); local_rank: the process's LOCAL_RANK, "
        "which picks a subgroup's NIC (-1: the group's own topology decides).",
        // The rendezvous waits for the slowest rank: without the GIL, as torch's own backends'
        // constructors, so the process's other Python threads run meanwhile (a Python Store's
        // calls take it back themselves).
        py::call_guard<py::gil_scoped_release>());
  // The backend's own Python type (torch's functions receive it as a Backend, which it is): what
  // torch looks for on a backend that splits, beyond the C++ interface.
  py::class_<smddp::torch_backend::ProcessGroupSmddp, ::c10d::Backend,
             c10::intrusive_ptr<smddp::torch_backend::ProcessGroupSmddp>>(m, "ProcessGroupSmddp",
                                                                          "The smddp c10d backend.")
      // torch 2.14's new_group, where the default group is bound to a device and its backend
      // splits, calls this on every rank left out of the new group (for ncclCommSplit, which
      // needs the whole parent). smddp's members rendezvous among themselves: nothing to do.
      .def("perform_nocolor_split", [](smddp::torch_backend::ProcessGroupSmddp&, const py::object&) {},
           py::arg("device"), "No-op: an smddp subgroup is made by its members alone.");
  m.def("build_info", &smddp::build_info);
  m.def("local_node_key", &smddp::topology::local_node_key,
        "This rank's node as the communicator groups ranks (SMDDP_NODE_ID, else host name and boot id).");
  m.def("reduce_isa", &smddp::reduce::isa, "The CPU reduction kernels in use (avx512, avx2, scalar).");
  m.def("env_params", [] {
    std::vector<std::tuple<std::string, std::string, std::string, std::string>> out;
    for (const auto& p : smddp::config::params())
      out.emplace_back(p.name, p.default_value, smddp::config::get_string(p.name), p.help);
    return out;
  }, "(name, default, effective value, meaning) of every SMDDP_* parameter.");
}
