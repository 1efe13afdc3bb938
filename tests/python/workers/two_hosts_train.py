"""Started on two (namespace) hosts, two ranks each, by a launcher users use: torchrun per node
(Slurm's sbatch in seed 000's style, SageMaker's launcher in seed 002's) or srun directly, with no
torchrun variables (smddp.launch_env fills them from SLURM_*). Checks what the launcher says
against what the process group sees, then an allreduce, an allgather and 5 DDP steps over smddp
against gloo in the same job. SMDDP_NODE_ID names the host (set by the test's "site")."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import smddp  # noqa: F401  (registers the backend; fills RANK, ... under srun)
from common import check_ddp_against_gloo, checker

mode = sys.argv[1]
dist.init_process_group(backend="smddp")
rank, world = dist.get_rank(), dist.get_world_size()
check, done = checker()
check("backend", dist.get_backend() == "smddp", dist.get_backend())
check("world", world == 4, world)
if mode == "srun":
    check("rank from Slurm", rank == int(os.environ["SLURM_PROCID"]), (rank, os.environ["SLURM_PROCID"]))
    check("world from Slurm", world == int(os.environ["SLURM_NTASKS"]), os.environ["SLURM_NTASKS"])
    check("local rank from Slurm", os.environ["LOCAL_RANK"] == os.environ["SLURM_LOCALID"],
          (os.environ["LOCAL_RANK"], os.environ["SLURM_LOCALID"]))
    check("no torchrun", "TORCHELASTIC_RUN_ID" not in os.environ, "started by torchrun")
gloo = dist.new_group(backend="gloo")
nodes = [None] * world
dist.all_gather_object(nodes, os.environ["SMDDP_NODE_ID"], group=gloo)
check("two hosts, two ranks each", len(set(nodes)) == 2 and all(nodes.count(n) == 2 for n in nodes), nodes)

x = torch.arange(100000, dtype=torch.float32) * (rank + 1)
a, b = x.clone(), x.clone()
dist.all_reduce(a)
dist.all_reduce(b, group=gloo)
check("all_reduce vs gloo", torch.equal(a, b), (a - b).abs().max().item())
outs = [torch.empty(1000) for _ in range(world)], [torch.empty(1000) for _ in range(world)]
dist.all_gather(outs[0], x[:1000])
dist.all_gather(outs[1], x[:1000], group=gloo)
check("all_gather vs gloo", all(torch.equal(p, q) for p, q in zip(*outs)), "differs")

check_ddp_against_gloo(nn.parallel.DistributedDataParallel, gloo, rank, check)
dist.barrier()
dist.destroy_process_group()
done()
