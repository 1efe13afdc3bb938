"""smddp: topology-aware collectives for PyTorch.

    import smddp
    torch.distributed.init_process_group(backend="smddp")

Importing this package registers the "smddp" backend with torch.distributed, and, for ranks
started by mpirun, srun or SageMaker rather than torchrun, fills the rendezvous variables
torch's env:// needs from the launcher's own (smddp.launch_env; never overriding any).
"""
import os as _os

import torch
import torch.distributed as _dist

from . import _C
from . import ddp_logging as _ddp_logging
from . import intra_op as _intra_op
from . import launch_env as _launch_env

__version__ = _C.__version__
__all__ = ["__version__", "is_registered"]

_BACKEND = "smddp"


def _create_backend(store, rank, size, timeout):
    # Where the launcher left OMP_NUM_THREADS unset, torch's OpenMP pool of every rank would
    # spin on the cores the collectives need (intra_op.py; SMDDP_INTRA_OP_THREADS).
    # A subgroup's traffic between nodes takes the NIC of the process's own local rank.
    local_rank = _launch_env.local_rank_for_group(size, _os.environ)
    backend, _ = _intra_op.apply(store, size, _C.local_node_key(),
                                 lambda: _C.create_backend(store, rank, size, timeout, local_rank))
    return backend


def _register():
    if hasattr(_dist.Backend, _BACKEND.upper()):  # registered already (re-import, alias module)
        return
    try:
        _dist.Backend.register_backend(_BACKEND, _create_backend, devices=["cpu", "cuda"])
    except TypeError:  # torch without the `devices` argument
        _dist.Backend.register_backend(_BACKEND, _create_backend)


def is_registered():
    """True once torch.distributed knows the "smddp" backend."""
    return hasattr(_dist.Backend, _BACKEND.upper())


_register()
# torch's thread count now is the one nobody chose after import (intra_op.py).
_intra_op.remember()
# DDP's logging data says "smddp" rather than torch's "custom" for plugins (ddp_logging.py).
_ddp_logging.install()
# Jobs started by mpirun, srun or SageMaker's MPI launcher: RANK, WORLD_SIZE, MASTER_ADDR, ...
# from their launcher's variables, before init_process_group reads them (never overriding).
_launch_env.fill_and_log()
