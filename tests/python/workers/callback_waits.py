"""A callback chained on a collective's future runs on the thread that completes the collective
(smddp's engine thread, for async_op=True). A callback that waits there on a receive of the same
group would wait forever: the receive moves only after the callback returns. It raises instead
(RuntimeError naming the receive), the error reaches the chained future, and the group goes on:
the receive completes afterwards and later collectives give the right sums. Rank 1 joins the
allreduce only once rank 0 has chained the callback (a key in the store), so the callback is in
place before the allreduce can finish."""
from datetime import timedelta

import torch
import torch.distributed as dist

import smddp  # noqa: F401  (registers the backend)

from common import checker

check, done = checker()
dist.init_process_group(backend="smddp")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2, "written for 2 ranks"

store = dist.distributed_c10d._get_default_store()
got = torch.zeros(4)
t = torch.full((4,), float(rank + 1))
if rank == 1:
    store.wait(["callback_chained"], timedelta(seconds=60))
fut = dist.all_reduce(t, async_op=True).get_future()
if rank == 0:
    ran_on = []

    def receive_inside(f):
        ran_on.append(f.done())
        dist.recv(got, src=1)  # synchronous: waits inside the callback
        return f.value()

    chained = fut.then(receive_inside)
    store.set("callback_chained", "1")
    try:
        chained.wait()
        check("a callback waiting on a receive inside it gets an error", False, "it returned")
    except RuntimeError as e:
        check("the error names the receive and why", "recv #" in str(e) and "inside a completion callback" in str(e),
              str(e)[:300])
    check("the callback ran after the allreduce finished", ran_on == [True], ran_on)
fut.wait()
check("the allreduce's own result", torch.equal(t, torch.full((4,), 3.0)), t)
if rank == 1:
    dist.send(torch.full((4,), 7.0), dst=0)
# Issued after the receive: runs after it has completed (p2p before the next collective).
s = torch.full((8,), float(rank))
dist.all_reduce(s)
check("a later allreduce", torch.equal(s, torch.full((8,), 1.0)), s)
if rank == 0:
    check("the receive the callback issued completed afterwards", torch.equal(got, torch.full((4,), 7.0)), got)
dist.destroy_process_group()
done()
