"""Where a collective runs: a synchronous call (torch passes asyncOp=False) runs on the calling
thread and has finished when the call returns; async_op=True returns at once, before a late peer
arrives, and completes later (the engine thread), also when nobody waits for it. Both give the
right sums, also interleaved."""
import time

import torch
import torch.distributed as dist

import smddp  # noqa: F401  (registers the backend)

from common import checker

check, done = checker()


def init_with_a_late_peer(late=3.0):
    """init_process_group while the other ranks arrive `late` seconds late (after their own
    imports: a margin of 2 s for the ranks' imports to end apart on a loaded machine): the backend's
    rendezvous waits for them without the GIL (as gloo's and NCCL's constructors do), so the
    process's other Python threads (a heartbeat, a progress reporter) run meanwhile. It held it,
    freezing every other thread of the process for as long as the slowest rank took."""
    import os
    import threading
    if int(os.environ["RANK"]) != 0:
        time.sleep(late)
        dist.init_process_group(backend="smddp")
        return
    gaps, stop = [], threading.Event()

    def tick():
        last = time.monotonic()
        while not stop.is_set():
            time.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
    t = threading.Thread(target=tick)
    t.start()
    start = time.monotonic()
    dist.init_process_group(backend="smddp")
    took = time.monotonic() - start
    stop.set()
    t.join()
    check("init waited for the late peer", took > 1.0, f"{took:.2f} s")
    check("other threads run while init waits", max(gaps) < 0.5,
          f"a thread waited {max(gaps):.2f} s for the GIL during a {took:.2f} s init_process_group")


init_with_a_late_peer()
rank, world = dist.get_rank(), dist.get_world_size()
pg = dist.distributed_c10d._get_default_group()
expect = world * (world + 1) / 2


def late_peer(late=1.0):
    """Everyone but rank 0 arrives `late` seconds late. Rank 0 waits 0.1 s, so that the engine
    thread that ran the barrier (torch 2.6 calls it asynchronously) is idle again."""
    dist.barrier()
    time.sleep(late if rank != 0 else 0.1)


# async_op=True: the call returns before the late peers arrive; wait() then gives the sum. Timed
# across processes: 2 s late, a margin a loaded machine keeps.
late_peer(2.0)
t = torch.full((1000,), float(rank + 1))
t0 = time.monotonic()
w = dist.all_reduce(t, async_op=True)
returned = time.monotonic() - t0
if rank == 0:
    check("async all_reduce returns before the late peer arrives", returned < 1.0, f"{returned:.3f} s")
    check("async all_reduce is not completed before the late peer arrives", not w.is_completed())
w.wait()
check("async all_reduce sum", torch.equal(t, torch.full((1000,), expect)), t[:4])

# asyncOp=False where this torch has the field: done when the call returns, on this thread.
for name in ("AllreduceOptions", "AllgatherOptions", "ReduceScatterOptions"):
    opts = getattr(torch._C._distributed_c10d, name)()
    if not hasattr(opts, "asyncOp"):
        print(f"rank {rank}: this torch's {name} has no asyncOp; its wait() runs it instead", flush=True)
        continue
    opts.asyncOp = False
    for _ in range(3):
        late_peer()
        x = torch.full((world * 8,), float(rank + 1))
        if name == "AllreduceOptions":
            w = pg.allreduce([x], opts)
            out, want = x, torch.full((world * 8,), expect)
        elif name == "AllgatherOptions":
            out = torch.empty(world * world * 8)
            w = pg._allgather_base(out, x, opts)
            want = torch.cat([torch.full((world * 8,), float(r + 1)) for r in range(world)])
        else:
            out = torch.empty(8)
            w = pg._reduce_scatter_base(out, x, opts)
            want = torch.full((8,), expect)
        check(f"{name} asyncOp=False: completed when the call returns", w.is_completed())
        w.wait()
        check(f"{name} asyncOp=False: result", torch.equal(out, want), out[:4])

# Nobody waits: right after synchronous calls (torch 2.6 runs its all_reduce in wait(), and the
# engine dozes, not woken for what is queued), async calls whose work is neither waited for nor
# asked for its future must still complete on their own (the engine starts them after a tick).
for _ in range(20):
    dist.all_reduce(torch.ones(4))
xs = [torch.full((64,), float(rank + 1)) for _ in range(3)]
ws = [dist.all_reduce(x, async_op=True) for x in xs]
deadline = time.monotonic() + 20
while not all(w.is_completed() for w in ws) and time.monotonic() < deadline:
    time.sleep(0.001)
check("async all_reduce nobody waits for completes on its own", all(w.is_completed() for w in ws))
for x in xs:
    check("async all_reduce nobody waited for: sum", torch.equal(x, torch.full((64,), expect)), x[:4])

# Interleaved: async calls queued on the engine, then synchronous ones that must run after them.
ts = [torch.full((4096,), float(rank + i)) for i in range(8)]
works = [dist.all_reduce(x, async_op=True) for x in ts[:4]]
for x in ts[4:]:
    dist.all_reduce(x)
for w in works:
    w.wait()
for i, x in enumerate(ts):
    want = sum(r + i for r in range(world))
    check(f"interleaved all_reduce {i}", torch.equal(x, torch.full((4096,), float(want))), x[:4])

dist.destroy_process_group()
done()
