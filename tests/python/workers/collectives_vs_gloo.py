"""Every torch.distributed collective under smddp, compared with gloo on identical inputs in the
same run (ints exactly, floats allclose). Where gloo lacks the op or dtype (AVG, PREMUL_SUM, some
dtypes) or is wrong (reduce_scatter_tensor ignores the op in 2.6), a locally computed reference
replaces it; the checks that do so say so in their name."""
import datetime
import os
import time
import threading

import torch
import torch.distributed as dist

import smddp  # noqa: F401
from common import checker, same

check, done = checker()
# Pretend nodes (SMDDP_TEST_NODES=k): rank r is on node r // (world / k), so the backend runs its
# cross-node path (libfabric over loopback between the pretend nodes, shared memory inside).
if os.environ.get("SMDDP_TEST_NODES"):
    per = int(os.environ["WORLD_SIZE"]) // int(os.environ["SMDDP_TEST_NODES"])
    os.environ["SMDDP_NODE_ID"] = f"pretend{int(os.environ['RANK']) // per}"
    os.environ.setdefault("FI_TCP_IFACE", "lo")
dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
RO = dist.ReduceOp

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool]
OPS = {"SUM": RO.SUM, "PRODUCT": RO.PRODUCT, "MIN": RO.MIN, "MAX": RO.MAX, "BAND": RO.BAND, "BOR": RO.BOR,
       "BXOR": RO.BXOR, "AVG": RO.AVG}


def inputs(r, n, dtype, opname, salt):
    g = torch.Generator().manual_seed(1000 * salt + r)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if opname == "PRODUCT":
        v = torch.tensor([1, 2, -1, 1])[torch.randint(0, 4, (n,), generator=g)]
        return (v.abs() if dtype == torch.uint8 else v).to(dtype)
    if opname in ("BAND", "BOR", "BXOR"):
        return torch.randint(0, 100, (n,), generator=g).to(dtype)
    v = torch.randint(0, 11, (n,), generator=g)
    return (v if dtype == torch.uint8 else v - 5).to(dtype)


def valid(dtype, opname):
    fl = dtype.is_floating_point
    if opname in ("BAND", "BOR", "BXOR"):
        return not fl
    if opname == "AVG":
        return dtype != torch.bool
    return True


def local_reference(n, dtype, opname, salt, factor=None):
    xs = [inputs(r, n, dtype, opname, salt) for r in range(world)]
    if dtype == torch.bool:
        acc = xs[0].clone()
        for x in xs[1:]:
            acc = {"SUM": acc | x, "MAX": acc | x, "BOR": acc | x, "PRODUCT": acc & x, "MIN": acc & x,
                   "BAND": acc & x, "BXOR": acc ^ x}[opname]
        return acc
    if opname == "AVG":
        s = torch.stack([x.double() for x in xs]).sum(0)
        return (s / world).to(dtype) if dtype.is_floating_point else torch.div(s, world, rounding_mode="trunc").to(dtype)
    if factor is not None:
        return (torch.stack([x.double() * factor for x in xs]).sum(0)).to(dtype)
    acc = xs[0].clone()
    for x in xs[1:]:
        acc = {"SUM": lambda a, b: a + b, "PRODUCT": lambda a, b: a * b, "MIN": torch.minimum, "MAX": torch.maximum,
               "BAND": lambda a, b: a & b, "BOR": lambda a, b: a | b, "BXOR": lambda a, b: a ^ b}[opname](acc, x)
    return acc


def gloo_or_ref(fn, ref_fn):
    """Runs fn() on gloo; if gloo refuses, returns (ref_fn(), 'ref')."""
    try:
        return fn(), "gloo"
    except (RuntimeError, ValueError):
        return ref_fn(), "ref"


salt = 0
# ---- all_reduce: every dtype x op, two sizes, in place; and non-contiguous ------------------
for n in (1, 1031):
    for dtype in DTYPES:
        for opname, op in OPS.items():
            if not valid(dtype, opname):
                continue
            salt += 1
            x = inputs(rank, n, dtype, opname, salt)
            ours = x.clone()
            dist.all_reduce(ours, op=op)
            if opname == "AVG":  # gloo (2.6) has no AVG
                theirs, src = local_reference(n, dtype, opname, salt), "ref"
            else:
                def run_gloo():
                    y = x.clone()
                    dist.all_reduce(y, op=op, group=gloo)
                    return y
                theirs, src = gloo_or_ref(run_gloo, lambda: local_reference(n, dtype, opname, salt))
            check(f"all_reduce {dtype} {opname} n={n} vs {src}", same(ours, theirs, not dtype.is_floating_point),
                  f"{ours[:8].tolist()} vs {theirs[:8].tolist()}")

# PREMUL_SUM (the NCCL-style op PyTorch exposes for scaling gradients)
for dtype in (torch.float32, torch.float64, torch.bfloat16):
    salt += 1
    x = inputs(rank, 257, dtype, "SUM", salt)
    ours = x.clone()
    dist.all_reduce(ours, op=dist._make_nccl_premul_sum(0.5))
    ref = local_reference(257, dtype, "SUM", salt, factor=0.5)
    check(f"all_reduce {dtype} PREMUL_SUM(0.5) vs ref", same(ours, ref, False), f"{ours[:4]} vs {ref[:4]}")

# Non-contiguous tensors
base = torch.arange(48, dtype=torch.float32).reshape(6, 8) * (rank + 1)
view = base[:, ::2]
expect = torch.arange(48, dtype=torch.float32).reshape(6, 8)[:, ::2] * (world * (world + 1) / 2)
dist.all_reduce(view)
check("all_reduce non-contiguous", torch.equal(view, expect) and torch.equal(base[:, ::2], expect))
check("all_reduce non-contiguous leaves the gaps", torch.equal(base[:, 1::2],
      (torch.arange(48, dtype=torch.float32).reshape(6, 8) * (rank + 1))[:, 1::2]))

# Complex SUM works; complex MAX is a clear Python error, not a crash
c = torch.complex(torch.ones(4) * rank, torch.ones(4))
dist.all_reduce(c)
check("all_reduce complex SUM", torch.allclose(c, torch.complex(torch.ones(4) * sum(range(world)),
                                                                torch.ones(4) * world)))
try:  # torch itself refuses this one in Python...
    dist.all_reduce(torch.complex(torch.ones(2), torch.ones(2)), op=RO.MAX)
    check("complex MAX raises", False, "no exception")
except (RuntimeError, ValueError) as e:
    check("complex MAX raises a clear error", "complex" in str(e) and "max" in str(e).lower(), str(e))
try:  # ...so call the backend the way C++ callers reach it, past torch's Python check
    opts = dist.AllreduceOptions()
    opts.reduceOp = RO.MAX
    dist.distributed_c10d._get_default_group().allreduce([torch.complex(torch.ones(2), torch.ones(2))], opts).wait()
    check("complex MAX in the backend raises", False, "no exception")
except RuntimeError as e:
    check("complex MAX in the backend raises a clear error", "complex" in str(e) and "max" in str(e), str(e))

# all_reduce_coalesced (deprecated in torch, still callable)
if hasattr(dist, "all_reduce_coalesced"):
    import warnings
    ts = [torch.ones(3) * rank, torch.arange(5, dtype=torch.float32) + rank]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.all_reduce_coalesced(ts)
    s = sum(range(world))
    check("all_reduce_coalesced", torch.equal(ts[0], torch.ones(3) * s) and
          torch.equal(ts[1], torch.arange(5, dtype=torch.float32) * world + s))

# ---- broadcast / reduce ----------------------------------------------------------------------
for root in range(world):
    for dtype in (torch.float32, torch.int64, torch.bool, torch.complex64, torch.int16):
        t = (torch.arange(10) + root).to(dtype) if rank == root else torch.zeros(10, dtype=dtype)
        dist.broadcast(t, src=root)
        check(f"broadcast root={root} {dtype}", torch.equal(t, (torch.arange(10) + root).to(dtype)))
    salt += 1
    x = inputs(rank, 300, torch.float32, "SUM", salt)
    ours, theirs = x.clone(), x.clone()
    dist.reduce(ours, dst=root)
    dist.reduce(theirs, dst=root, group=gloo)
    if rank == root:
        check(f"reduce root={root} vs gloo", same(ours, theirs, False))
    else:
        check(f"reduce root={root} leaves non-root input", torch.equal(ours, x))

# ---- all_gather (list), all_gather_into_tensor, object collectives -----------------------------
for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.bool):
    x = (torch.arange(7) * (rank + 1)).to(dtype)
    ours = [torch.empty(7, dtype=dtype) for _ in range(world)]
    dist.all_gather(ours, x)

    def gloo_gather():
        theirs = [torch.empty(7, dtype=dtype) for _ in range(world)]
        dist.all_gather(theirs, x, group=gloo)
        return theirs
    theirs, src = gloo_or_ref(gloo_gather, lambda: [(torch.arange(7) * (r + 1)).to(dtype) for r in range(world)])
    check(f"all_gather {dtype} vs {src}", all(torch.equal(a, b) for a, b in zip(ours, theirs)))
out = torch.empty(world * 5, dtype=torch.float64)
dist.all_gather_into_tensor(out, torch.full((5,), float(rank), dtype=torch.float64))
check("all_gather_into_tensor", torch.equal(out, torch.arange(world, dtype=torch.float64).repeat_interleave(5)))
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
check("all_gather_object", objs == [{"rank": r, "s": "x" * r} for r in range(world)], str(objs))
lst = [f"hello {rank}", rank] if rank == 0 else [None, None]
dist.broadcast_object_list(lst, src=0)
check("broadcast_object_list", lst == ["hello 0", 0], str(lst))

# all_gather_into_tensor_coalesced, as FSDP issues it through the coalescing manager
if hasattr(dist, "_coalescing_manager"):
    outs = [torch.empty(world * 3), torch.empty(world * 2, dtype=torch.int32)]
    ins = [torch.full((3,), float(rank)), torch.full((2,), rank, dtype=torch.int32)]
    try:
        with dist._coalescing_manager(async_ops=False):
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        check("all_gather_into_tensor coalesced", torch.equal(outs[0], torch.arange(world).float().repeat_interleave(3))
              and torch.equal(outs[1], torch.arange(world, dtype=torch.int32).repeat_interleave(2)))
    except Exception as e:  # noqa: BLE001
        check("all_gather_into_tensor coalesced", False, repr(e))

# ---- reduce_scatter (list) and reduce_scatter_tensor ---------------------------------------------
for opname in ("SUM", "MAX", "MIN", "PRODUCT"):
    salt += 1
    x = inputs(rank, 4 * world, torch.float32, opname, salt)
    out = torch.empty(4)
    dist.reduce_scatter(out, list(x.chunk(world)), op=OPS[opname])
    ref = local_reference(4 * world, torch.float32, opname, salt).chunk(world)[rank]
    check(f"reduce_scatter {opname} vs ref", same(out, ref, False), f"{out} vs {ref}")
    out2 = torch.empty(4)
    dist.reduce_scatter_tensor(out2, x, op=OPS[opname])
    check(f"reduce_scatter_tensor {opname} vs ref (gloo ignores the op)", same(out2, ref, False), f"{out2} vs {ref}")
    if opname == "SUM":
        out3 = torch.empty(4)
        dist.reduce_scatter_tensor(out3, x, group=gloo)
        check("reduce_scatter_tensor SUM vs gloo", same(out2, out3, False))

# ---- all_to_all (list), all_to_all_single even and uneven ----------------------------------------
ins = [torch.full((r + 1,), rank * 10 + r, dtype=torch.int64) for r in range(world)]
outs = [torch.empty(rank + 1, dtype=torch.int64) for _ in range(world)]
dist.all_to_all(outs, ins)
check("all_to_all uneven list", all(torch.equal(outs[s], torch.full((rank + 1,), s * 10 + rank)) for s in range(world)))
x = torch.arange(world * 3, dtype=torch.float32) + 100 * rank
y = torch.empty(world * 3)
z = torch.empty(world * 3)
dist.all_to_all_single(y, x)
dist.all_to_all_single(z, x, group=gloo)
check("all_to_all_single even vs gloo", torch.equal(y, z))
in_splits = [(rank + d) % 3 + 1 for d in range(world)]          # rows rank sends to d
out_splits = [(s + rank) % 3 + 1 for s in range(world)]         # rows rank gets from s
x = torch.cat([torch.full(((rank + d) % 3 + 1, 2), rank * 100 + d, dtype=torch.float32) for d in range(world)])
y = torch.empty(sum(out_splits), 2)
z = torch.empty(sum(out_splits), 2)
dist.all_to_all_single(y, x, out_splits, in_splits)
dist.all_to_all_single(z, x, out_splits, in_splits, group=gloo)
check("all_to_all_single uneven splits vs gloo", torch.equal(y, z), f"{y.flatten()[:10]} vs {z.flatten()[:10]}")
# A dtype smddp moves as bytes (int16), rank 0 sending nothing at all (an MoE rank without
# tokens): the others' rows still count in bytes. Reference: the rows each rank sends.
in_splits = [0 if rank == 0 else (rank + d) % 2 + 1 for d in range(world)]
out_splits = [0 if s == 0 else (s + rank) % 2 + 1 for s in range(world)]
x = torch.cat([torch.full((in_splits[d], 3), rank * 100 + d, dtype=torch.int16) for d in range(world)])
y = torch.full((sum(out_splits), 3), -1, dtype=torch.int16)
dist.all_to_all_single(y, x, out_splits, in_splits)
want = torch.cat([torch.full((out_splits[s], 3), s * 100 + rank, dtype=torch.int16) for s in range(world)])
check("all_to_all_single int16 with an empty input on rank 0", torch.equal(y, want), f"{y.flatten()[:12]}")

# ---- the caller's thread-local state -------------------------------------------------------------
# The copies back into the user's tensors run on the engine thread (an async call left to it: the
# sleep), under the caller's inference and grad modes, and below autograd's in-place checks, as
# gloo writes the result in place.
with torch.inference_mode():
    t = torch.full((3,), float(rank))
    outs = [torch.empty(3) for _ in range(world)]
    err = ""
    try:
        w = dist.all_gather(outs, t, async_op=True)
        time.sleep(0.2)
        w.wait()
    except RuntimeError as e:
        err = str(e)
    check("async all_gather under torch.inference_mode()",
          not err and all(torch.equal(outs[r], torch.full((3,), float(r))) for r in range(world)), err)
conv = torch.nn.Conv2d(4, 4, 3).to(memory_format=torch.channels_last)  # a non-contiguous leaf
conv_g = torch.nn.Conv2d(4, 4, 3).to(memory_format=torch.channels_last)
with torch.no_grad():
    for c in (conv, conv_g):
        c.weight.copy_(torch.arange(c.weight.numel(), dtype=torch.float32).view_as(c.weight) + rank)
for mode in ("no_grad", "grad enabled"):
    err = ""
    with torch.no_grad() if mode == "no_grad" else torch.enable_grad():
        try:
            w = dist.all_reduce(conv.weight, async_op=True)
            time.sleep(0.2)
            w.wait()
        except RuntimeError as e:
            err = str(e)
        dist.all_reduce(conv_g.weight, group=gloo)
    check(f"all_reduce of a channels_last weight that requires grad, {mode}, vs gloo",
          not err and torch.equal(conv.weight, conv_g.weight) and conv.weight.requires_grad, err)

# ---- gather / scatter ------------------------------------------------------------------------------
for root in range(world):
    x = torch.full((3,), float(rank))
    g = [torch.empty(3) for _ in range(world)] if rank == root else None
    dist.gather(x, g, dst=root)
    if rank == root:
        check(f"gather root={root}", all(torch.equal(g[r], torch.full((3,), float(r))) for r in range(world)))
    out = torch.empty(2, dtype=torch.int32)
    sc = [torch.full((2,), 7 * r, dtype=torch.int32) for r in range(world)] if rank == root else None
    dist.scatter(out, sc, src=root)
    check(f"scatter root={root}", torch.equal(out, torch.full((2,), 7 * rank, dtype=torch.int32)))

# ---- send / recv, isend / irecv, batch_isend_irecv --------------------------------------------------
nxt, prv = (rank + 1) % world, (rank - 1) % world
if world > 1:
    big = torch.arange(300_000, dtype=torch.float32) + rank
    got = torch.empty_like(big)
    ops = [dist.P2POp(dist.isend, big, nxt), dist.P2POp(dist.irecv, got, prv)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    check("batch_isend_irecv ring (1.2 MB each way)", torch.equal(got, torch.arange(300_000, dtype=torch.float32) + prv))
    # The coalescing manager around isend/irecv: batch_isend_irecv's path for CUDA tensors on
    # torch 2.6 (startCoalescing/endCoalescing), taken here on CPU tensors.
    if hasattr(dist, "_coalescing_manager"):
        got2 = torch.empty(5, dtype=torch.int64)
        with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
            dist.isend(torch.arange(5) * 10 + rank, nxt)
            dist.irecv(got2, prv)
        cm.wait()
        check("isend/irecv in the coalescing manager", torch.equal(got2, torch.arange(5) * 10 + prv), str(got2))
    if rank == 0:
        dist.send(torch.tensor([42, 43]), dst=1, tag=5)
    elif rank == 1:
        r = torch.empty(2, dtype=torch.int64)
        dist.recv(r, src=0, tag=5)
        check("send/recv with tag", r.tolist() == [42, 43])
    # A pipeline stage's pending irecv, then an allreduce of the same group whose peer sends only
    # after it (as gloo and NCCL allow): the allreduce used to wait for the receive, all hung.
    stage = torch.empty(300_000)
    x = torch.full((4,), float(rank + 1))
    if rank == 0:
        req = dist.irecv(stage, src=1, tag=9)
    dist.all_reduce(x)
    if rank == 0:
        req.wait()
        check("allreduce beside a pending irecv", torch.equal(x, torch.full((4,), float(world * (world + 1) // 2)))
              and torch.equal(stage, torch.arange(300_000, dtype=torch.float32)), str(x))
    elif rank == 1:
        dist.send(torch.arange(300_000, dtype=torch.float32), dst=0, tag=9)
    # The other way round: an async_op allreduce, then a send whose peer receives before its own
    # allreduce. The send used to wait for the allreduce, which waited for the peer: all hung.
    y = torch.full((4,), float(rank + 1))
    if rank == 0:
        work = dist.all_reduce(y, async_op=True)
        dist.send(torch.arange(300_000, dtype=torch.float32) * 2, dst=1, tag=11)
        work.wait()
    else:
        if rank == 1:
            back = torch.empty(300_000)
            dist.recv(back, src=0, tag=11)
            check("a send after an async_op allreduce", torch.equal(back, torch.arange(300_000, dtype=torch.float32) * 2))
        dist.all_reduce(y)
    check("the allreduce before that send", torch.equal(y, torch.full((4,), float(world * (world + 1) // 2))), str(y))
    # A synchronous all_reduce on the main thread while a second thread sends to a rank that
    # receives before its own all_reduce: the send used to wait for the all_reduce (run on the
    # calling thread), which waited for the peer: all hung until the timeout.
    z = torch.full((4,), float(rank + 1))
    if rank == 0:
        thread_err = []

        def send_from_a_thread():
            try:
                time.sleep(0.1)  # the main thread's all_reduce is waiting by then
                dist.send(torch.arange(300_000, dtype=torch.float32) * 3, dst=1, tag=13)
            except RuntimeError as e:
                thread_err.append(str(e))

        sender = threading.Thread(target=send_from_a_thread)
        sender.start()
        dist.all_reduce(z)
        sender.join()
        check("a send from another thread beside a synchronous all_reduce", not thread_err, str(thread_err))
    else:
        if rank == 1:
            back = torch.empty(300_000)
            dist.recv(back, src=0, tag=13)
            check("a send from another thread beside a synchronous all_reduce, received",
                  torch.equal(back, torch.arange(300_000, dtype=torch.float32) * 3))
        dist.all_reduce(z)
    check("the all_reduce beside that thread's send", torch.equal(z, torch.full((4,), float(world * (world + 1) // 2))), str(z))
    if rank == 0:  # receive from any source (across pretend nodes too when SMDDP_TEST_NODES is set)
        got = set()
        for _ in range(world - 1):
            r = torch.empty(1, dtype=torch.int64)
            src = dist.recv(r)  # no src: any sender; returns who sent it
            check("recv from any source", r.item() == 500 + src, f"{r.item()} from {src}")
            got.add(src)
        check("recv from any source saw every sender", got == set(range(1, world)), str(got))
    else:
        dist.send(torch.tensor([500 + rank]), dst=0)

# ---- barriers --------------------------------------------------------------------------------------
dist.barrier()
# torch's Python dist.monitored_barrier admits only gloo; the backend implements it for callers
# that reach the process group directly.
dist.distributed_c10d._get_default_group().monitored_barrier(datetime.timedelta(seconds=30), True)
check("barrier and monitored_barrier", True)

# ---- subgroups: each its own communicator, mixed with the default group ------------------------------
if world >= 2:
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    odds = dist.new_group([r for r in range(world) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    check("new_group all_reduce", t.item() == sum(r for r in range(world) if r % 2 == rank % 2), str(t))
    t2 = torch.tensor([1.0])
    dist.all_reduce(t2)
    check("default group after subgroups", t2.item() == world)

dist.destroy_process_group()
done()
