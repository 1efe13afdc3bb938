"""smddp: topology-aware collectives for PyTorch.

    import smddp
    torch.distributed.init_process_group(backend="smddp")

Importing this package registers the "smddp" backend with torch.distributed.
"""
import torch
import torch.distributed as _dist

from . import _C

__version__ = _C.__version__
__all__ = ["__version__", "is_registered"]

_BACKEND = "smddp"


def _register():
    if hasattr(_dist.Backend, _BACKEND.upper()):  # registered already (re-import, alias module)
        return
    try:
        _dist.Backend.register_backend(_BACKEND, _C.create_backend, devices=["cpu", "cuda"])
    except TypeError:  # torch without the `devices` argument
        _dist.Backend.register_backend(_BACKEND, _C.create_backend)


def is_registered():
    """True once torch.distributed knows the "smddp" backend."""
    return hasattr(_dist.Backend, _BACKEND.upper())


_register()
