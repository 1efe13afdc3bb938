"""Receive from any source through torch.distributed, under load, and teardown while the engine
thread needs the GIL.

    gil      a Work's future callback (Python, so it takes the GIL on the engine thread) is still
             running when the process group is destroyed from Python: must not deadlock.
    stress N [NODES]  N rounds: a root receives per_sender messages from every other rank with recv/irecv
             from any source, while a tagged ring exchange is in flight and all_reduce runs
             between rounds; every message says who sent it and its index (in order per sender).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import smddp  # noqa: F401
from common import checker

check, done = checker()
mode = sys.argv[1]
nodes = int(sys.argv[3]) if len(sys.argv) > 3 else 1  # > 1: the ranks pretend to be that many nodes
if nodes > 1:
    os.environ["SMDDP_NODE_ID"] = f"p2p-node{int(os.environ['RANK']) * nodes // int(os.environ['WORLD_SIZE'])}"
    os.environ.setdefault("FI_TCP_IFACE", "lo")
dist.init_process_group(backend="smddp")
rank, world = dist.get_rank(), dist.get_world_size()

if mode == "gil":
    # Rank 1 joins the all_reduce 0.3 s late, so on rank 0 it completes on the engine thread,
    # which then runs the callback (0.3-0.8 s); rank 0's main thread destroys the group at 0.5 s.
    t = torch.ones(8)
    if rank == 1:
        time.sleep(0.3)
    work = dist.all_reduce(t, async_op=True)
    ran = []
    fut = work.get_future().then(lambda f: (time.sleep(0.5), ran.append(1)))
    time.sleep(0.5 if rank == 0 else 0.2)
    t0 = time.time()
    dist.destroy_process_group()
    took = time.time() - t0
    check("the callback ran before the group was gone", ran == [1], str(ran))
    check("destroy waited for the callback, not forever", took < 30, f"{took:.1f} s")
    check("all_reduce result", torch.equal(t, torch.full((8,), float(world))), str(t))
    done()
    sys.exit(0)

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 200
per_sender = 3
sizes = [1, 5, 1000, 70000]
received = 0
for it in range(rounds):
    root = it % world
    right, left = (rank + 1) % world, (rank - 1) % world
    ring_out = torch.full((100,), float(rank * 1000 + it))
    ring_in = torch.full((100,), -1.0)
    reqs = []
    if world > 1:
        reqs = [dist.irecv(ring_in, src=left, tag=7), dist.isend(ring_out, dst=right, tag=7)]
    n = sizes[it % len(sizes)]
    if rank == root:
        nxt = [0] * world
        for k in range(per_sender * (world - 1)):
            buf = torch.full((n,), -1.0, dtype=torch.float64)
            if k % 2 == 0:
                src = dist.recv(buf, tag=5)
            else:
                w = dist.irecv(buf, tag=5)
                w.wait()
                src = w._source_rank()
            want = src * 1_000_000 + it * 10 + nxt[src]
            ok = 0 <= src < world and src != root and bool((buf == want).all())
            if not ok:
                check(f"round {it} message {k}", False, f"from {src}: {buf[:3].tolist()} wanted {want}")
                break
            nxt[src] += 1
            received += 1
    else:
        for k in range(per_sender):
            dist.send(torch.full((n,), float(rank * 1_000_000 + it * 10 + k), dtype=torch.float64), dst=root, tag=5)
    for r in reqs:
        r.wait()
    if world > 1 and not bool((ring_in == left * 1000 + it).all()):
        check(f"round {it} ring message", False, str(ring_in[:3].tolist()))
    if it % 10 == 0:
        x = torch.ones(1)
        dist.all_reduce(x)
        if x.item() != world:
            check(f"round {it} all_reduce", False, str(x.item()))
total = torch.tensor([float(received)])
dist.all_reduce(total)
check("every message arrived", total.item() == rounds * per_sender * (world - 1), str(total.item()))
dist.destroy_process_group()
done()
