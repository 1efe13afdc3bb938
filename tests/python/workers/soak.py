"""A random soak against an independent oracle (#11): N random collectives through
torch.distributed over smddp, each result checked against a reference this rank computes by
itself from every rank's input (inputs are a function of (seed, op, rank), so every rank can make
all of them; no other backend is consulted). Kinds: every collective torch offers plus
send/recv rings, in place and out, on the world group and on subgroups; dtypes and ops of every
kind; counts 0, 1, odd, and up to ~300k. Float inputs are small integers, so sums, products and
their reductions are exact in every float dtype and results compare bit for bit (avg, which
divides, within the dtype's rounding).

Usage: soak.py OPS SEED [NODES]  (NODES > 1: the ranks pretend to be that many nodes, so the
cross-node algorithms over libfabric run; set before smddp loads.) Prints the first mismatch in
full and exits 1; else "rank R ALL OK".
"""
import datetime
import os
import random
import sys

OPS, SEED = int(sys.argv[1]), int(sys.argv[2])
NODES = int(sys.argv[3]) if len(sys.argv) > 3 else 1
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
# Where the ranks are: pretend nodes, or the hosts a multi-node launcher placed them on.
WHERE = f"{NODES} node(s)" if NODES > 1 or "SMDDP_NODE_ID" not in os.environ else f"host {os.environ['SMDDP_NODE_ID']}"
if NODES > 1:
    os.environ["SMDDP_NODE_ID"] = f"soak-node{RANK * NODES // WORLD}"
    os.environ.setdefault("FI_TCP_IFACE", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import smddp  # noqa: E402,F401

dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=120))
R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]
MOVE_ONLY = [torch.bool, torch.complex64]
COUNTS = [0, 1, 2, 3, 7, 31, 64, 1000, 4097, 65537]

# Subgroups every rank makes in the same order (torch requires it); a member calls on them.
SUBSETS = [list(range(WORLD))]
if WORLD > 2:
    SUBSETS += [[0, WORLD - 1], list(range(1, WORLD)), list(range(0, WORLD, 2))]
if WORLD == 2:
    SUBSETS += [[1]]
GROUPS = [None] + [dist.new_group(s) for s in SUBSETS[1:]]


def value(op_seed, rank, count, dtype, small=False):
    """Rank `rank`'s input of op `op_seed`: small integers, exact in every dtype."""
    g = torch.Generator().manual_seed(op_seed * 1000 + rank)
    lo, hi = (1, 3) if small else (-8, 9)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=g).bool()
    if dtype == torch.uint8:
        lo, hi = (1, 3) if small else (0, 16)
    if dtype.is_complex:
        return torch.complex(torch.randint(lo, hi, (count,), generator=g).float(),
                             torch.randint(lo, hi, (count,), generator=g).float()).to(dtype)
    return torch.randint(lo, hi, (count,), generator=g).to(dtype)


def reduce_ref(tensors, op, dtype):
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op in (R.SUM, R.AVG):
            acc = acc + t
        elif op == R.PRODUCT:
            acc = acc * t
        elif op == R.MIN:
            acc = torch.minimum(acc, t)
        elif op == R.MAX:
            acc = torch.maximum(acc, t)
        elif op == R.BAND:
            acc = acc & t
        elif op == R.BOR:
            acc = acc | t
        elif op == R.BXOR:
            acc = acc ^ t
    if op == R.AVG:
        acc = (acc.double() / len(tensors)).to(dtype)
    return acc.to(dtype)


def fail(i, desc, got, want):
    diff = (got != want).nonzero()
    at = diff[0].tolist() if len(diff) else "shape"
    print(f"rank {RANK} FAIL op #{i} {desc}: first difference at {at}: got "
          f"{got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()} (shapes {tuple(got.shape)} "
          f"{tuple(want.shape)})", flush=True)
    sys.exit(1)


def same(got, want, inexact):
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if inexact:
        tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(want.dtype, 1e-6)
        return torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    return torch.equal(got, want)


checks = 0
for i in range(OPS):
    rnd = random.Random(SEED * 1_000_003 + i)
    gi = rnd.randrange(len(SUBSETS)) if rnd.random() < 0.3 else 0
    members, group = SUBSETS[gi], GROUPS[gi]
    kind = rnd.choice(["all_reduce", "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                       "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter",
                       "barrier", "send_recv", "all_reduce_coalesced"])
    dtype = rnd.choice(FLOATS + INTS + (MOVE_ONLY if kind in ("broadcast", "all_gather", "all_gather_into_tensor",
                                                              "all_to_all_single", "gather", "scatter",
                                                              "send_recv") else []))
    if dtype.is_floating_point:
        op = rnd.choice([R.SUM, R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG])
    else:
        op = rnd.choice([R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR])
    count = rnd.choice(COUNTS) if rnd.random() < 0.9 else rnd.randrange(100_000, 300_000)
    root_i = rnd.randrange(len(members))
    in_place = rnd.random() < 0.5
    op_seed = SEED * 1_000_003 + i
    if RANK not in members:
        continue
    G, me, root = len(members), members.index(RANK), members[root_i]
    small = op == R.PRODUCT
    inp = {r: value(op_seed, r, count, dtype, small) for r in members}
    x = inp[RANK].clone()
    desc = f"{kind}({dtype}, {count}, {op}, root {root}, group {members}, in_place {in_place})"
    inexact = op == R.AVG
    if kind == "all_reduce":
        dist.all_reduce(x, op=op, group=group)
        got, want = x, reduce_ref([inp[r] for r in members], op, dtype)
    elif kind == "all_reduce_coalesced":
        cut = count // 3
        parts = [x[:cut].clone(), x[cut:].clone()]
        dist.all_reduce_coalesced(parts, op=op, group=group)
        got, want = torch.cat(parts), reduce_ref([inp[r] for r in members], op, dtype)
    elif kind == "broadcast":
        dist.broadcast(x, src=root, group=group)
        got, want = x, inp[root]
    elif kind == "reduce":
        dist.reduce(x, dst=root, op=op, group=group)
        if RANK != root:
            continue
        got, want = x, reduce_ref([inp[r] for r in members], op, dtype)
    elif kind == "all_gather":
        outs = [torch.empty_like(x) for _ in members]
        dist.all_gather(outs, x, group=group)
        got, want = torch.stack(outs), torch.stack([inp[r] for r in members])
    elif kind == "all_gather_into_tensor":
        out = torch.empty(G * count, dtype=dtype)
        if in_place:  # the input is this rank's block of the output (FSDP's layout)
            out[me * count:(me + 1) * count].copy_(x)
            x = out[me * count:(me + 1) * count]
        dist.all_gather_into_tensor(out, x, group=group)
        got, want = out, torch.cat([inp[r] for r in members])
    elif kind in ("reduce_scatter", "reduce_scatter_tensor"):
        per = count // G
        full = {r: inp[r][:per * G] for r in members}
        want = reduce_ref([full[r][me * per:(me + 1) * per] for r in members], op, dtype)
        out = torch.empty(per, dtype=dtype)
        if kind == "reduce_scatter":
            dist.reduce_scatter(out, list(full[RANK].clone().chunk(G)) if per else [torch.empty(0, dtype=dtype)] * G,
                                op=op, group=group)
        else:
            src = full[RANK].clone()
            if in_place:  # the output is this rank's block of the input
                out = src[me * per:(me + 1) * per]
            dist.reduce_scatter_tensor(out, src, op=op, group=group)
        got = out
    elif kind == "all_to_all_single":
        # Uneven splits, the same on every rank: rank j sends split[k] elements to rank k.
        srnd = random.Random(op_seed)
        splits = [[srnd.randrange(0, 6) for _ in members] for _ in members]  # splits[j][k]
        src = value(op_seed, RANK, sum(splits[me]), dtype)
        out = torch.empty(sum(splits[k][me] for k in range(G)), dtype=dtype)
        dist.all_to_all_single(out, src, output_split_sizes=[splits[k][me] for k in range(G)],
                               input_split_sizes=splits[me], group=group)
        pieces = []
        for k, r in enumerate(members):
            theirs = value(op_seed, r, sum(splits[k]), dtype)
            off = sum(splits[k][:me])
            pieces.append(theirs[off:off + splits[k][me]])
        got, want = out, torch.cat(pieces)
    elif kind == "gather":
        outs = [torch.empty_like(x) for _ in members] if RANK == root else None
        dist.gather(x, outs, dst=root, group=group)
        if RANK != root:
            continue
        got, want = torch.stack(outs), torch.stack([inp[r] for r in members])
    elif kind == "scatter":
        out = torch.empty_like(x)
        dist.scatter(out, [value(op_seed + 7, k, count, dtype) for k in range(G)] if RANK == root else None,
                     src=root, group=group)
        got, want = out, value(op_seed + 7, me, count, dtype)
    elif kind == "barrier":
        dist.barrier(group=group)
        continue
    else:  # send_recv: a ring inside the group (a group of one sends to itself: skip)
        if G == 1:
            continue
        nxt, prv = members[(me + 1) % G], members[(me - 1) % G]
        out = torch.empty_like(x)
        reqs = [dist.isend(x, nxt, tag=i % 1000), dist.irecv(out, prv, tag=i % 1000)]
        for q in reqs:
            q.wait()
        got, want = out, inp[prv]
    checks += 1
    if not same(got, want, inexact):
        fail(i, desc, got, want)

dist.barrier()
dist.destroy_process_group()
print(f"rank {RANK} ALL OK {checks} checks of {OPS} random collectives (seed {SEED}, {WHERE})", flush=True)
