"""Subgroups split from the parent's backend (torch >= 2.14's split path), checked against gloo's
splits of a gloo group over the same ranks, in the same processes.

torch splits backends where the default group is bound to an accelerator
(init_process_group(device_id=...)): split_group, and init_device_mesh over such a group; new_group
then asks the ranks left out to take part in a no-colour split. Debian's torch has no accelerator,
so the torch code that a GPU run takes is reached here in two ways:
  1. ProcessGroup.split_group, the C++ call that torch's split_group makes once its accelerator
     checks pass (nothing pretended);
  2. torch's Python split_group and init_device_mesh themselves, and the split source new_group
     asks the ranks it leaves out to split, with torch.accelerator answering "cpu" and the
     default group bound to the cpu (only that is pretended: the accelerator's name; the split,
     the stores and the groups are torch's and ours).
Run by torchrun with 4 ranks: groups of [[0, 1], [2, 3]], a mesh of 2 x 2, a group torch leaves
ranks out of, and a split whose rank list is out of order; on one node or two pretend ones.
"""
import gc
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import smddp  # noqa: F401  (registers the backend)
from common import checker

check, done = checker()
# Pretend nodes (SMDDP_TEST_NODES=2): ranks 0 1 on one, 2 3 on the other, so the mesh's dp groups
# ([0, 2], [1, 3]: one process per node, HSDP's replicate groups) run between nodes.
if os.environ.get("SMDDP_TEST_NODES"):
    per = int(os.environ["WORLD_SIZE"]) // int(os.environ["SMDDP_TEST_NODES"])
    os.environ["SMDDP_NODE_ID"] = f"pretend{int(os.environ['RANK']) // per}"
    os.environ.setdefault("FI_TCP_IFACE", "lo")
dist.init_process_group("smddp", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 4, "run with 4 ranks"
world_pg = dist.distributed_c10d._get_default_group()
gloo_world = dist.new_group(backend="gloo")  # the reference, made before anything is pretended
parent = world_pg._get_backend(torch.device("cpu"))
check("the backend is smddp's own type", type(parent).__name__ == "ProcessGroupSmddp", type(parent))
check("the backend splits", parent.supports_splitting, "supports_splitting is false")


def is_smddp(pg):
    """The group's backend is an smddp one (dist.get_backend would read the parent's name)."""
    return type(pg._get_backend(torch.device("cpu"))).__name__ == "ProcessGroupSmddp"


def ops_of(pg, gloo_pg, what):
    """The same collectives on a subgroup of smddp and one of gloo over the same ranks: equal results."""
    me, n = pg.rank(), pg.size()
    check(f"{what}: rank and size as gloo's", (me, n) == (gloo_pg.rank(), gloo_pg.size()),
          f"{(me, n)} against gloo's {(gloo_pg.rank(), gloo_pg.size())}")
    base = torch.arange(12, dtype=torch.float32) * (rank + 1) + rank
    results = {}
    for name, g in (("smddp", pg), ("gloo", gloo_pg)):
        r = {}
        t = base.clone()
        g.allreduce([t]).wait()
        r["allreduce"] = t
        out = torch.empty(12 * n)
        g._allgather_base(out, base.clone()).wait()
        r["all_gather_into_tensor"] = out
        rs = torch.empty(12 // n if 12 % n == 0 else 1)
        if 12 % n == 0:
            g._reduce_scatter_base(rs, base.clone()).wait()
        r["reduce_scatter_tensor"] = rs
        b = base.clone()
        g.broadcast(b, n - 1).wait()
        r["broadcast"] = b
        results[name] = r
    for op in results["smddp"]:
        a, b = results["smddp"][op], results["gloo"][op]
        check(f"{what}: {op} as gloo's", torch.equal(a, b), f"{a.tolist()} against gloo's {b.tolist()}")


# 1. torch's C++ split, as its split_group calls it: every rank of the parent takes part.
mine = [0, 1] if rank < 2 else [2, 3]
sub = world_pg.split_group(mine, timeout=timedelta(seconds=60), group_name=f"cpp_split_{mine[0]}")
gloo_sub = gloo_world.split_group(mine, timeout=timedelta(seconds=60), group_name=f"cpp_split_gloo_{mine[0]}")
check("C++ split: a member gets a group", sub is not None, "None")
if sub is not None:
    ops_of(sub, gloo_sub, f"C++ split {mine}")
    check("C++ split: a child of smddp is smddp", is_smddp(sub), type(sub._get_backend(torch.device("cpu"))))
# A rank outside the new group gets no group and does nothing (ranks 2, 3 for [0, 1]).
out = world_pg.split_group([0, 1], timeout=timedelta(seconds=60), group_name="cpp_split_01_only")
check("C++ split: a non-member gets None", (out is None) == (rank >= 2), f"rank {rank} got {out}")
if out is not None:
    t = torch.ones(3) * rank
    out.allreduce([t]).wait()
    check("C++ split: the members' group sums", torch.equal(t, torch.ones(3)), t.tolist())

# A split group's communicator (its engine thread) ends when the group goes, not when the parent
# next splits: the parent remembers its last split only weakly.
def threads():
    return len(os.listdir("/proc/self/task"))


before = threads()
brief = world_pg.split_group([0, 1, 2, 3], timeout=timedelta(seconds=60), group_name="brief")
t = torch.ones(2)
brief.allreduce([t]).wait()
during = threads()
del brief
gc.collect()
for _ in range(100):  # a joined thread leaves /proc/self/task at once, or nearly
    if threads() <= before:
        break
    time.sleep(0.01)
check("a split group's thread ends with the group", during > before and threads() <= before,
      f"threads: {before} before, {during} with it, {threads()} after")

# 2. torch's own Python paths that split, with the accelerator's name pretended to be "cpu".
torch.accelerator.is_available = lambda: True
torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cpu")
world_pg.bound_device_id = torch.device("cpu", 0)

g = dist.split_group(split_ranks=[[0, 1], [2, 3]], timeout=timedelta(seconds=60))
gg = dist.split_group(parent_pg=gloo_world, split_ranks=[[0, 1], [2, 3]], timeout=timedelta(seconds=60))
check("split_group: the group's ranks", dist.get_process_group_ranks(g) == mine, dist.get_process_group_ranks(g))
check("split_group: a child of smddp is smddp", is_smddp(g), type(g._get_backend(torch.device("cpu"))))
ops_of(g, gg, "split_group [[0, 1], [2, 3]]")
t = torch.full((5,), float(rank))
dist.all_reduce(t, group=g)  # through torch.distributed, as a user calls it
check("split_group: dist.all_reduce on it", torch.equal(t, torch.full((5,), float(sum(mine)))), t.tolist())

# Out of order: ranks 3, 1 (torch's split keeps or sorts the order; each member's rank follows it).
odd = dist.split_group(split_ranks=[[3, 1], [2, 0]], timeout=timedelta(seconds=60))
godd = dist.split_group(parent_pg=gloo_world, split_ranks=[[3, 1], [2, 0]], timeout=timedelta(seconds=60))
ops_of(odd, godd, "split_group [[3, 1], [2, 0]]")
order = [3, 1] if rank in (3, 1) else [2, 0]
check("split_group: the list's order gives the group ranks", odd.rank() == order.index(rank),
      f"rank {rank} is {odd.rank()} in {order}")

# A device mesh: each dimension's groups come from split_group (one call per dimension).
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
for dim, groups in (("dp", [[0, 2], [1, 3]]), ("tp", [[0, 1], [2, 3]])):
    pg = mesh.get_group(dim)
    want = next(x for x in groups if rank in x)
    check(f"mesh {dim}: ranks", dist.get_process_group_ranks(pg) == want, dist.get_process_group_ranks(pg))
    check(f"mesh {dim}: smddp", is_smddp(pg), type(pg._get_backend(torch.device("cpu"))))
    ops_of(pg, dist.split_group(parent_pg=gloo_world, split_ranks=groups, timeout=timedelta(seconds=60)),
           f"mesh {dim} {want}")

# new_group where the default group splits: torch asks each rank left out of the new group to take
# part in a no-colour split, calling perform_nocolor_split on the backend _get_split_source finds.
# (With the accelerator pretended, new_group itself refuses the cpu device before it gets there.)
split_from = dist.distributed_c10d._get_split_source(world_pg)
check("new_group's split source is smddp", type(split_from).__name__ == "ProcessGroupSmddp", type(split_from))
split_from.perform_nocolor_split(world_pg.bound_device_id)  # a no-op that must exist: no AttributeError

# Bad input named (what torch passes on unchecked: a rank outside the parent).
try:
    world_pg.split_group([0, 7], group_name="bad_split")
    check("a rank outside the parent is refused", False, "accepted")
except Exception as e:  # noqa: BLE001  (torch raises RuntimeError or ValueError)
    check("a rank outside the parent is refused, named", "rank 7 (position 1 of the new group's ranks) is not in "
          "this group" in str(e), str(e))

dist.barrier()
dist.destroy_process_group()
done()
