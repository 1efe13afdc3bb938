"""A training script in the style of SageMaker's SMDDP before 1.4 (smdistributed.dataparallel's
own `dist` module and DDP class; init_process_group() with no arguments), started by a launcher
that is not torchrun (mpirun; launch_env fills RANK, MASTER_ADDR, ...). Checked against gloo in
the same job: an allreduce, and DDP training (smddp) against the same model trained over gloo.
Expects to be started with no torchrun variables in its environment."""
import os

import torch

import smdistributed.dataparallel.torch.distributed as dist
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP

from common import check_ddp_against_gloo, checker

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
check, done = checker()
check("backend", dist.get_backend() == "smddp", dist.get_backend())
check("world from the launcher", world == int(os.environ["OMPI_COMM_WORLD_SIZE"]), world)
check("rank from the launcher", rank == int(os.environ["OMPI_COMM_WORLD_RANK"]), rank)
check("local rank", dist.get_local_rank() == int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]), dist.get_local_rank())
check("local size", dist.get_local_size() == int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"]), dist.get_local_size())
check("SMDATAPARALLEL_LOCAL_RANK", os.environ.get("SMDATAPARALLEL_LOCAL_RANK") == str(dist.get_local_rank()),
      os.environ.get("SMDATAPARALLEL_LOCAL_RANK"))
gloo = dist.new_group(backend="gloo")

x = torch.arange(1000, dtype=torch.float32) * (rank + 1)
a, b = x.clone(), x.clone()
dist.all_reduce(a)
dist.all_reduce(b, group=gloo)
check("all_reduce vs gloo", torch.equal(a, b), (a - b).abs().max().item())

check_ddp_against_gloo(DDP, gloo, rank, check)
dist.barrier()
dist.destroy_process_group()
done()
