"""DDP's logging data names smddp.

torch gives every plugin backend the process-group type CUSTOM, so DDP's reducer logs
backend_name "custom" for a job on smddp (`DistributedDataParallel._get_ddp_logging_data()`,
which users' tooling and torch's own tests read), while `dist.get_backend()` says "smddp". No
hook of torch's lets a plugin name itself there, so the dictionary DDP hands back is corrected
for DDP modules whose process group runs on smddp; any other backend's entry is left as torch
wrote it. torch's internal usage record (C++, `c10::LogPyTorchDDPUsage`) still carries "custom".
"""
import torch.distributed as _dist

_BACKEND = "smddp"


def install():
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a torch built without distributed support has no DDP to correct
        return
    original = DistributedDataParallel._get_ddp_logging_data
    if getattr(original, "_smddp", False):  # installed already (re-import)
        return

    def _get_ddp_logging_data(self):
        data = original(self)
        if data.get("backend_name") == "custom":
            try:
                if _dist.get_backend(self.process_group) == _BACKEND:
                    data["backend_name"] = _BACKEND
            except (RuntimeError, ValueError):  # the group was destroyed: report what torch logged
                pass
        return data

    _get_ddp_logging_data._smddp = True
    _get_ddp_logging_data.__doc__ = original.__doc__
    DistributedDataParallel._get_ddp_logging_data = _get_ddp_logging_data
