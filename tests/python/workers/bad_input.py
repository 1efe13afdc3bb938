"""Bad input at the torch surface (#11 item 6): every call below is wrong in one argument on
every rank. Each must raise at once (no rank waits for a peer) with a message that names the
collective, the argument and, where smddp raises it, the rank; the group must then still work.
Calls torch itself refuses before they reach the backend are listed as such. Then inputs that
look odd but are valid (non-contiguous tensors, AVG on integers) must give the right result,
checked against a local reference. Last, an argument wrong on the root only: the root raises at
once, and the other rank, already inside the collective, gets an error naming the disagreement
within the timeout instead of a hang.

Usage: bad_input.py (under torchrun, any world size >= 2)."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import smddp  # noqa: F401
from common import checker

check, done = checker()
TIMEOUT_S = 5
dist.init_process_group(backend="smddp", timeout=datetime.timedelta(seconds=TIMEOUT_S))
rank, world = dist.get_rank(), dist.get_world_size()
R = dist.ReduceOp
me = f"rank {rank}"

# (what is wrong, the call, fragments the message must hold; None: torch refuses it first)
CASES = [
    ("a bitwise op on floats", lambda: dist.all_reduce(torch.ones(4), op=R.BAND),
     [me, "allreduce", "band", "f32"]),
    ("MAX on complex", lambda: dist.all_reduce(torch.ones(4, dtype=torch.complex64), op=R.MAX), None),
    ("allgather: one output too many", lambda: dist.all_gather([torch.empty(3) for _ in range(world + 1)],
                                                               torch.ones(3)),
     [me, "allgather", "world-size"]),
    ("allgather: outputs of another size", lambda: dist.all_gather([torch.empty(4) for _ in range(world)],
                                                                   torch.ones(3)),
     [me, "allgather", "3 elements", "4"]),
    ("allgather: outputs of another dtype",
     lambda: dist.all_gather([torch.empty(3, dtype=torch.float64) for _ in range(world)], torch.ones(3)), None),
    ("allgather: an output on another device",
     lambda: dist.all_gather([torch.empty(3, device="meta") for _ in range(world)], torch.ones(3)),
     [me, "allgather", "meta"]),
    ("all_gather_into_tensor: output size", lambda: dist.all_gather_into_tensor(torch.empty(3 * world + 1),
                                                                                torch.ones(3)),
     [me, "all_gather_into_tensor", f"{3 * world + 1} elements", f"world size {world}"]),
    ("all_gather_into_tensor: output dtype",
     lambda: dist.all_gather_into_tensor(torch.empty(3 * world, dtype=torch.float64), torch.ones(3)),
     [me, "all_gather_into_tensor", "dtype", "Double", "Float"]),
    ("reduce_scatter_tensor: input size", lambda: dist.reduce_scatter_tensor(torch.empty(3),
                                                                             torch.ones(3 * world + 1)),
     [me, "reduce_scatter_tensor", f"{3 * world + 1} elements"]),
    ("reduce_scatter: one input too many",
     lambda: dist.reduce_scatter(torch.empty(3), [torch.ones(3) for _ in range(world + 1)]),
     [me, "reduce_scatter", "world-size"]),
    ("reduce_scatter: one input of another dtype", lambda: dist.reduce_scatter(
        torch.empty(3, dtype=torch.float64),
        [torch.ones(3, dtype=torch.float32 if r == 0 else torch.float64) for r in range(world)]), None),
    # The same through the process group itself, which torch's Python check does not guard: the
    # list, concatenated, would be promoted to its common dtype.
    ("reduce_scatter on the group: one input of another dtype",
     lambda: dist.distributed_c10d._get_default_group().reduce_scatter(
         [torch.empty(3, dtype=torch.float64)],
         [[torch.ones(3, dtype=torch.float32 if r == 0 else torch.float64) for r in range(world)]]).wait(),
     [me, "reduce_scatter", "output dtype Double differs from input dtype Float"]),
    ("reduce_scatter: inputs of another size",
     lambda: dist.reduce_scatter(torch.empty(3), [torch.ones(4) for _ in range(world)]),
     [me, "reduce_scatter", "3 elements", "4"]),
    ("all_to_all_single: splits that do not add up",
     lambda: dist.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world), [5] * world, [4] * world),
     [me, "all_to_all_single", "splits", f"{5 * world}"]),
    ("all_to_all_single: rows of dim 0 that do not split evenly (the elements would)",
     lambda: dist.all_to_all_single(torch.empty(world + 1, 2 * world), torch.ones(world + 1, 2 * world)),
     [me, "all_to_all_single", "dim 0 of size", f"{world + 1}"]),
    ("all_to_all_single: a negative split (the sum agrees)",
     lambda: dist.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world),
                                    [4] * world, [-1, 4 * world + 1 - 4 * (world - 2)] + [4] * (world - 2)),
     [me, "all_to_all_single", "input split 0", "-1 rows (negative)"]),
    ("all_to_all_single: a split list of the wrong length",
     lambda: dist.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world), [4] * (world + 1),
                                    [4] * (world + 1)),
     [me, "all_to_all_single", "one entry per rank"]),
    ("all_to_all: lists of the wrong length",
     lambda: dist.all_to_all([torch.empty(2) for _ in range(world)], [torch.ones(2) for _ in range(world + 1)]),
     [me, "all_to_all", "world-size"]),
    ("broadcast: a root past the last rank", lambda: dist.broadcast(torch.ones(2), src=world + 3),
     [me, "broadcast", f"root {world + 3}", f"[0, {world})"]),
    ("reduce: a negative root", lambda: dist.reduce(torch.ones(2), dst=-1),
     [me, "reduce", "root -1"]),
    ("send to a rank past the last", lambda: dist.send(torch.ones(2), dst=world + 5),
     [me, "send", f"peer {world + 5}"]),
    ("recv from a rank past the last", lambda: dist.recv(torch.ones(2), src=world + 5),
     [me, "recv", f"peer {world + 5}"]),
    ("send to itself", lambda: dist.send(torch.ones(2), dst=rank), None),
    ("a sparse allreduce with MAX", lambda: dist.all_reduce(torch.ones(4).to_sparse(), op=R.MAX),
     [me, "sparse", "max"]),
    # the input a view of another rank's block of the output (in place it is this rank's own)
    ("all_gather_into_tensor: the input overlapping another block of the output",
     (lambda out: lambda: dist.all_gather_into_tensor(out, out[3 * ((rank + 1) % world):][:3]))(torch.zeros(3 * world)),
     [me, "allgather", "overlap", "in-place form"]),
    ("reduce_scatter_tensor: the output overlapping another block of the input",
     (lambda inp: lambda: dist.reduce_scatter_tensor(inp[3 * ((rank + 1) % world):][:3], inp))(torch.ones(3 * world)),
     [me, "reduce_scatter", "overlap", "in-place form"]),
    ("a coalesced allreduce of mixed dtypes",
     lambda: dist.all_reduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.float64)]), None),
]


def group_works(after):
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    check(f"the group works after {after}", torch.equal(t, torch.full((3,), world * (world + 1) / 2)), t)


for what, call, fragments in CASES:
    t0 = time.time()
    try:
        call()
        check(f"{what}: raises", False, "no exception")
    except (RuntimeError, ValueError) as e:
        msg = str(e)
        check(f"{what}: raises at once", time.time() - t0 < TIMEOUT_S / 2, f"{time.time() - t0:.1f} s")
        if fragments is not None:
            missing = [f for f in fragments if f not in msg]
            check(f"{what}: the message names what was wrong", not missing, f"missing {missing} in: {msg}")
    group_works(what)

# A coalesced call whose second pair is wrong fails whole, before its first pair goes: that
# output keeps what it held (a first pair already submitted ran on, its staging freed under it).
first = torch.full((2,), -7.0)
try:
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(first, torch.ones(2 * world))
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world + 1))
    check("a coalesced reduce_scatter_tensor with a wrong second pair raises", False, "no exception")
except (RuntimeError, ValueError) as e:
    check("a coalesced reduce_scatter_tensor with a wrong second pair names it",
          all(f in str(e) for f in (me, "reduce_scatter_tensor_coalesced", f"{2 * world + 1}")), str(e))
check("the coalesced call's first pair wrote nothing", torch.equal(first, torch.full((2,), -7.0)), first)
group_works("a coalesced call with a wrong second pair")
# The same when the second pair's dtype does not take the op (BAND on floats): refused before
# the first pair (integers, which take it) goes.
first = torch.full((2,), -7, dtype=torch.int32)
try:
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(first, torch.ones(2 * world, dtype=torch.int32), op=dist.ReduceOp.BAND)
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world), op=dist.ReduceOp.BAND)
    check("a coalesced BAND whose second pair is float raises", False, "no exception")
except (RuntimeError, ValueError) as e:
    check("a coalesced BAND whose second pair is float names the op and dtype",
          all(f in str(e) for f in (me, "band", "f32")), str(e))
check("the coalesced BAND's integer pair wrote nothing", torch.equal(first, torch.full((2,), -7, dtype=torch.int32)),
      first)
group_works("a coalesced call whose second pair does not take the op")

# Valid, if unusual: results against a local reference.
base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
t = (base * (rank + 1)).t()
dist.all_reduce(t)
check("allreduce of a non-contiguous tensor", torch.equal(t, base.t() * (world * (world + 1) // 2)), t)
t = (base * (1 if rank == 0 else 0)).t()
dist.broadcast(t, 0)
check("broadcast into a non-contiguous tensor", torch.equal(t, base.t()), t)
out = torch.zeros(3, world).t()  # (world, 3), the stacked form, not contiguous
dist.all_gather_into_tensor(out, torch.full((3,), float(rank + 1)))
check("all_gather_into_tensor into a non-contiguous stacked output",
      torch.equal(out, torch.arange(1, world + 1, dtype=torch.float32).repeat(3, 1).t()), out)
t = torch.full((4,), rank * 3 + 1, dtype=torch.int32)
dist.all_reduce(t, op=R.AVG)
total = sum(r * 3 + 1 for r in range(world))
check("AVG on int32 truncates the mean, as NCCL's does", torch.equal(t, torch.full((4,), total // world,
                                                                                  dtype=torch.int32)), t)

# An argument wrong on the root only: the others are already in the collective.
t0 = time.time()
try:
    dist.scatter(torch.empty(2), [torch.ones(2) for _ in range(world + 1)] if rank == 0 else None, src=0)
    check("a scatter list wrong at the root raises", False, "no exception")
except RuntimeError as e:
    took = time.time() - t0
    if rank == 0:
        check("the root names its list at once", "scatter" in str(e) and "world-size" in str(e) and took < 1,
              f"{took:.1f} s: {e}")
    else:
        # The root's next collective (below) meets this rank's scatter: the disagreement is found
        # and named; nothing waits for the timeout.
        check("the others learn of the disagreement", "different collectives" in str(e), str(e))
        check("... within the timeout", took < TIMEOUT_S + 5, f"{took:.1f} s")
if rank == 0:
    try:
        dist.all_reduce(torch.ones(2))
        check("the root's next collective fails (the communicator is aborted)", False, "no exception")
    except RuntimeError as e:
        check("the root's next collective names the disagreement", "different collectives" in str(e), str(e))
code = 0
try:
    done()
except SystemExit as e:
    code = e.code or 0
sys.stdout.flush()
os._exit(code)  # the communicator is aborted: leave without its (now failing) teardown
