"""CUDA tensors through smddp, each result checked against the same collective on CPU copies
through gloo in the same run: allreduce (every dtype x op the two share, AVG and PREMUL_SUM by a
local reference), broadcast, reduce, all_gather(_into_tensor), reduce_scatter(_tensor), gather,
scatter, all_to_all(_single) with uneven splits, send/recv (a ring, any source), the coalesced
forms, a non-contiguous tensor, stream order (the input still being written on the caller's
stream at the call: a side stream, and torch's default stream), an unawaited work, the future's
device (DDP's comm hooks) and its events not behind the default stream, barrier draining the
caller's stream, and DDP and FSDP2 with CUDA tensors against the same training on CPU over gloo.
Ranks share the GPUs there are."""
import datetime
import os
import time

import torch
import torch.distributed as dist

import smddp  # noqa: F401
from common import checker, same

check, done = checker()
dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
dev = torch.device("cuda", rank % torch.cuda.device_count())
torch.cuda.set_device(dev)
RO = dist.ReduceOp

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool]


def data(r, n, dtype, salt):
    g = torch.Generator().manual_seed(1000 * salt + r)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    return torch.randint(-5 if dtype != torch.uint8 else 0, 6, (n,), generator=g).to(dtype)


for n in (1, 1000, 300_001):
    for dtype in DTYPES:
        ops = {"SUM": RO.SUM, "MIN": RO.MIN, "MAX": RO.MAX}
        if not dtype.is_floating_point and dtype != torch.bool:
            ops.update({"BAND": RO.BAND, "BOR": RO.BOR, "BXOR": RO.BXOR})
        for name, op in ops.items():
            mine = data(rank, n, dtype, n)
            want = mine.clone()
            dist.all_reduce(want, op=op, group=gloo)
            got = mine.to(dev)
            dist.all_reduce(got, op=op)
            check(f"allreduce {dtype} {name} n={n}", same(got.cpu(), want, False), f"{got[:4]} vs {want[:4]}")
    # AVG and PREMUL_SUM (gloo has neither): the sum from gloo, scaled here
    x = data(rank, n, torch.float32, 7)
    total = x.clone()
    dist.all_reduce(total, group=gloo)
    got = x.to(dev)
    dist.all_reduce(got, op=RO.AVG)
    check(f"allreduce AVG n={n}", same(got.cpu(), total / world, False))
    got = x.to(dev)
    dist.all_reduce(got, op=dist._make_nccl_premul_sum(0.5))
    check(f"allreduce PREMUL_SUM n={n}", same(got.cpu(), total * 0.5, False))

    # data movement
    b = data(rank, n, torch.float32, 3).to(dev)
    dist.broadcast(b, src=world - 1)
    check(f"broadcast n={n}", same(b.cpu(), data(world - 1, n, torch.float32, 3), True))
    r = data(rank, n, torch.int64, 4).to(dev)
    dist.reduce(r, dst=0)
    if rank == 0:
        check(f"reduce n={n}", same(r.cpu(), sum(data(q, n, torch.int64, 4) for q in range(world)), True))
    out = torch.empty(world * n, device=dev)
    dist.all_gather_into_tensor(out, data(rank, n, torch.float32, 5).to(dev))
    check(f"all_gather_into_tensor n={n}", same(out.cpu(), torch.cat([data(q, n, torch.float32, 5) for q in range(world)]), True))
    outs = [torch.empty(n, device=dev) for _ in range(world)]
    dist.all_gather(outs, data(rank, n, torch.float32, 6).to(dev))
    check(f"all_gather n={n}", all(same(outs[q].cpu(), data(q, n, torch.float32, 6), True) for q in range(world)))
    rs_in = data(rank, world * n, torch.float32, 8)
    rs_want = rs_in.clone()
    dist.all_reduce(rs_want, group=gloo)
    rs = torch.empty(n, device=dev)
    dist.reduce_scatter_tensor(rs, rs_in.to(dev))
    check(f"reduce_scatter_tensor n={n}", same(rs.cpu(), rs_want[rank * n:(rank + 1) * n], False))
    rs = torch.empty(n, device=dev)
    dist.reduce_scatter(rs, list(rs_in.to(dev).chunk(world)))
    check(f"reduce_scatter n={n}", same(rs.cpu(), rs_want[rank * n:(rank + 1) * n], False))
    # gather, scatter, all_to_all_single: the same collective through gloo on CPU copies
    g_in = data(rank, n, torch.int32, 9)
    g_want = [torch.empty_like(g_in) for _ in range(world)] if rank == 0 else None
    dist.gather(g_in, g_want, dst=0, group=gloo)
    g_out = [torch.empty(n, dtype=torch.int32, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(g_in.to(dev), g_out, dst=0)
    if rank == 0:
        check(f"gather n={n}", all(same(g_out[q].cpu(), g_want[q], True) for q in range(world)))
    s_in = [data(q, n, torch.float32, 10) for q in range(world)] if rank == world - 1 else None
    s_want = torch.empty(n)
    dist.scatter(s_want, s_in, src=world - 1, group=gloo)
    s_got = torch.empty(n, device=dev)
    dist.scatter(s_got, [t.to(dev) for t in s_in] if s_in else None, src=world - 1)
    check(f"scatter n={n}", same(s_got.cpu(), s_want, True))
    # uneven splits: rank r sends (r + j) % 3 + 1 rows of width n to rank j
    width = min(n, 64)
    sends = [(rank + j) % 3 + 1 for j in range(world)]
    recvs = [(j + rank) % 3 + 1 for j in range(world)]
    a_in = data(rank, sum(sends) * width, torch.float32, 11).reshape(-1, width)
    a_want = torch.empty(sum(recvs), width)
    dist.all_to_all_single(a_want, a_in, recvs, sends, group=gloo)
    a_got = torch.empty(sum(recvs), width, device=dev)
    dist.all_to_all_single(a_got, a_in.to(dev), recvs, sends)
    check(f"all_to_all_single uneven n={n}", same(a_got.cpu(), a_want, True))
    l_in = [data(rank * world + j, n, torch.float64, 12) for j in range(world)]
    l_want = [data(q * world + rank, n, torch.float64, 12) for q in range(world)]  # gloo has no list all_to_all
    l_got = [torch.empty(n, dtype=torch.float64, device=dev) for _ in range(world)]
    dist.all_to_all(l_got, [t.to(dev) for t in l_in])
    check(f"all_to_all n={n}", all(same(l_got[q].cpu(), l_want[q], True) for q in range(world)))
    # send/recv through host copies: a ring of isend/irecv, then a receive from any source
    if world > 1:
        right, left = (rank + 1) % world, (rank - 1) % world
        p_out = data(rank, n, torch.bfloat16, 13).to(dev)
        p_in = torch.empty(n, dtype=torch.bfloat16, device=dev)
        ops = [dist.P2POp(dist.isend, p_out, right), dist.P2POp(dist.irecv, p_in, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(f"batch_isend_irecv ring n={n}", same(p_in.cpu(), data(left, n, torch.bfloat16, 13), True))
        # A receive issued on a side stream that still writes the buffer (after a sleep): the data
        # must land after that write, not before it and then be overwritten.
        w_send = dist.isend(p_out, right)
        side, late = torch.cuda.Stream(), torch.empty(n, dtype=torch.bfloat16, device=dev)
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)
            late.fill_(-1)
            w_recv = dist.irecv(late, left)
        w_send.wait()
        w_recv.wait()
        torch.cuda.synchronize()
        check(f"irecv after the caller's side stream n={n}", same(late.cpu(), data(left, n, torch.bfloat16, 13), True))
        if rank == 0:
            got_from = set()
            for _ in range(world - 1):
                any_in = torch.empty(n, dtype=torch.int64, device=dev)
                src = dist.recv(any_in)
                got_from.add(src)
                check(f"recv from any source n={n}", same(any_in.cpu(), data(src, n, torch.int64, 14), True))
            check(f"recv from any source heard every rank n={n}", got_from == set(range(1, world)), str(got_from))
        else:
            dist.send(data(rank, n, torch.int64, 14).to(dev), dst=0)

# non-contiguous: a transposed view, reduced and written back in place
m = torch.arange(12.0).reshape(3, 4).to(dev).t()
dist.all_reduce(m)
check("allreduce non-contiguous", same(m.cpu(), torch.arange(12.0).reshape(3, 4).t() * world, True))

# coalesced
with dist._coalescing_manager(async_ops=True) as cm:
    a1, a2 = torch.ones(5, device=dev), torch.full((7,), 2.0, device=dev)
    dist.all_reduce(a1)
    dist.all_reduce(a2)
cm.wait()
check("coalesced allreduce", same(a1.cpu(), torch.full((5,), float(world)), True) and
      same(a2.cpu(), torch.full((7,), 2.0 * world), True))

# stream order: the input is written by a kernel on a side stream made current, no host sync
side = torch.cuda.Stream(device=dev)
with torch.cuda.stream(side):
    big = torch.zeros(1 << 22, device=dev)
    for _ in range(20):
        big.add_(1)  # still running when the collective is called
    w = dist.all_reduce(big, async_op=True)
w.wait()
torch.cuda.synchronize(dev)
check("stream order", same(big.cpu(), torch.full((1 << 22,), 20.0 * world), True))

# stream order on torch's default stream (a null handle, the legacy stream; where DDP copies
# gradients into its buckets): a kernel that sleeps ~50 ms holds the stream, then the input is
# written there. A collective not ordered after it reads the old zeros.
d = torch.zeros(1 << 20, device=dev)
torch.cuda.synchronize(dev)
torch.cuda._sleep(100_000_000)  # GPU cycles: tens of ms on any GPU we run on
d.fill_(3.0)
dist.all_reduce(d)
torch.cuda.synchronize(dev)
check("stream order on the default stream", same(d.cpu(), torch.full((1 << 20,), 3.0 * world), True))

# the future carries the device and its value is the result (DDP's comm hooks)
f = dist.all_reduce(torch.ones(3, device=dev), async_op=True).get_future()
v = f.wait()[0]
check("future value on the GPU", v.device == dev and same(v.cpu(), torch.full((3,), float(world)), True), str(v))

# the future's CUDA events follow the collective alone: the thread that completes it has torch's
# default stream current, and work queued there (here ~2 s of sleep, issued before the call; in
# training the rest of the backward pass) must not hold a consumer ordered after the future.
# The collective itself runs on a side stream, so it is not ordered after the sleep.
torch.cuda.synchronize(dev)
torch.cuda._sleep(4_000_000_000)  # GPU cycles on the default stream: about 2 s
side = torch.cuda.Stream(device=dev)
with torch.cuda.stream(side):
    fw = dist.all_reduce(torch.ones(1024, device=dev), async_op=True)
fut = fw.get_future()  # outside the side stream: a future completed here sees the default stream
fw.wait()
consumer = torch.cuda.Stream(device=dev)
with torch.cuda.stream(consumer):
    doubled = fut.wait()[0] * 2  # the consumer uses the value, ordered after the future
ready = torch.cuda.Event()
ready.record(consumer)
t0 = time.monotonic()
while not ready.query() and time.monotonic() - t0 < 30:
    time.sleep(0.001)
behind = time.monotonic() - t0
default_busy = not torch.cuda.default_stream(dev).query()
check("the future does not wait for the default stream", ready.query() and default_busy,
      f"a consumer of the future was ready after {behind:.3f} s, the default stream still busy: {default_busy}")
torch.cuda.synchronize(dev)
check("the future's consumer reads the result", same(doubled.cpu(), torch.full((1024,), 2.0 * world), True))

# barrier orders the GPU as NCCL's does: on return, the work the caller queued on its current
# stream before the call is done (about 1 s of sleep here), on every rank
torch.cuda._sleep(2_000_000_000)
dist.barrier()
check("barrier drains the caller's stream", torch.cuda.current_stream(dev).query(),
      "the current stream still ran its work after barrier() returned")
torch.cuda._sleep(2_000_000_000)
dist.barrier(device_ids=[dev.index])  # the GPU named, not found from the collectives' GPUs
check("barrier(device_ids=...) drains that GPU's current stream", torch.cuda.current_stream(dev).query(),
      "the current stream still ran its work after barrier(device_ids=...) returned")

# an unawaited work: the tensor is kept alive and the next collective is ordered after it
t = torch.ones(1 << 20, device=dev)
dist.all_reduce(t, async_op=True)
del t
u = torch.ones(4, device=dev)
dist.all_reduce(u)
check("after an unawaited work", same(u.cpu(), torch.full((4,), float(world)), True))

# mixed devices are refused with both named
try:
    dist.all_gather_into_tensor(torch.empty(world * 2, device=dev), torch.ones(2))
    check("mixed devices refused", False, "accepted")
except (RuntimeError, ValueError) as e:
    check("mixed devices refused", "different devices" in str(e) or "device" in str(e), str(e))

# DDP on CUDA tensors vs DDP on CPU over gloo, same start and data
import copy  # noqa: E402

import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

torch.manual_seed(0)
base = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
gpu_model = DDP(copy.deepcopy(base).to(dev), device_ids=[dev.index])
cpu_model = DDP(copy.deepcopy(base), process_group=gloo)
opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (gpu_model, cpu_model)]
for step in range(5):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    for model, opt, d in ((gpu_model, opts[0], dev), (cpu_model, opts[1], torch.device("cpu"))):
        opt.zero_grad()
        nn.functional.mse_loss(model(x.to(d)), y.to(d)).backward()
        opt.step()
for (name, p), q in zip(gpu_model.module.named_parameters(), cpu_model.module.parameters()):
    check(f"DDP on CUDA matches CPU gloo: {name}", torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5))

# FSDP2 on CUDA tensors (all_gather_into_tensor, reduce_scatter_tensor with AVG or PREMUL_SUM on
# FSDP's own streams) vs FSDP2 on CPU over gloo, same start and data
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:
    from torch.distributed._composable.fsdp import fully_shard

torch.manual_seed(0)
base = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
sharded = {}
for name, d, group in (("cuda", dev, dist.group.WORLD), ("cpu", torch.device("cpu"), gloo)):
    model = copy.deepcopy(base).to(d)
    mesh = DeviceMesh.from_group(group, d.type)
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x.to(d)), y.to(d)).backward()
        opt.step()
    sharded[name] = [p.full_tensor().detach().cpu() for p in model.parameters()]
diff = max((a - b).abs().max().item() for a, b in zip(sharded["cuda"], sharded["cpu"]))
check("FSDP2 on CUDA matches CPU gloo", all(torch.allclose(a, b, rtol=1e-4, atol=1e-5)
                                          for a, b in zip(sharded["cuda"], sharded["cpu"])), f"max |diff| {diff}")

dist.destroy_process_group()
done()
