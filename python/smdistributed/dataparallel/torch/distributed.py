"""SageMaker's SMDDP API from before 1.4: `import smdistributed.dataparallel.torch.distributed as dist`.

Scripts written for it call `dist.init_process_group()` with no arguments and read
`dist.get_local_rank()`, `dist.get_local_size()`, `dist.get_rank()`, `dist.get_world_size()`; the
collectives (`all_reduce`, `broadcast`, `all_gather`, `barrier`, ...) take torch.distributed's
arguments. Here every one of them is torch.distributed's own, with the "smddp" backend as the
default, so such scripts run unchanged on smddp under torchrun, mpirun, srun or SageMaker (the
rendezvous variables come from the launcher: smddp.launch_env).
"""
import os

import torch.distributed as _dist
from torch.distributed import (  # noqa: F401  (the old API's names, torch's implementations)
    ReduceOp, all_gather, all_reduce, all_to_all, all_to_all_single, barrier, broadcast, destroy_process_group,
    gather, get_backend, get_rank, get_world_size, group, irecv, is_available, is_initialized, isend, new_group,
    recv, reduce, reduce_scatter, scatter, send)

import smddp  # noqa: F401  (registers the backend and fills the launcher's variables)


def init_process_group(backend="smddp", *args, **kwargs):
    """Joins the job's process group; SMDDP's took no arguments, so "smddp" is the default."""
    if _dist.is_initialized():
        return
    _dist.init_process_group(backend, *args, **kwargs)


def _env_int(name, what):
    v = os.environ.get(name)
    if v is None:
        raise RuntimeError(f"smdistributed.dataparallel: {what} is unknown: {name} is not set (start the job with "
                           "torchrun, mpirun, srun or SageMaker, or set it)")
    return int(v)


def get_local_rank():
    """This process's rank among the ranks of its node."""
    return _env_int("LOCAL_RANK", "the local rank")


def get_local_size():
    """How many ranks run on this node."""
    return _env_int("LOCAL_WORLD_SIZE", "the number of ranks on this node")
