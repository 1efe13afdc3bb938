"""Trains the same model twice in the same processes, once over smddp and once over gloo, and
checks the parameters agree after every run. Usage: train_compare.py MODE
MODE: ddp_toy | ddp_cnn | ddp_hook | ddp_join | fsdp1 | fsdp2 | hybrid"""
import copy
import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import smddp  # noqa: F401
from common import checker

mode = sys.argv[1]
check, done = checker()
dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
torch.manual_seed(0)


class ToyModel(nn.Module):  # the model of ../shared/seeds' DDP tutorial
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def batches(n, shape, classes=None, seed=0):
    g = torch.Generator().manual_seed(1000 * rank + seed)
    for _ in range(n):
        x = torch.randn(8, *shape, generator=g)
        y = torch.randint(0, classes, (8,), generator=g) if classes else torch.randn(8, 5, generator=g)
        yield x, y


def train(model, data, loss_fn, steps_done=None, join=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if join:
        from torch.distributed.algorithms.join import Join
        with Join([model]):
            for x, y in data:
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
    else:
        for x, y in data:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
    return model


def compare(a_params, b_params, what, rtol=1e-5, atol=1e-6):
    ok = all(torch.allclose(a, b, rtol=rtol, atol=atol) for a, b in zip(a_params, b_params))
    diff = max((a - b).abs().max().item() for a, b in zip(a_params, b_params))
    check(f"{what}: smddp vs gloo parameters", ok, f"max |diff| {diff}")
    moved = any(not torch.equal(a, b) for a, b in zip(a_params, init_params))
    check(f"{what}: training changed the parameters", moved)


from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

if mode in ("ddp_toy", "ddp_hook", "ddp_join"):
    base = ToyModel()
    init_params = [p.detach().clone() for p in base.parameters()]
    m1, m2 = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base), process_group=gloo)
    if mode == "ddp_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        m1.register_comm_hook(None, default_hooks.fp16_compress_hook)

        # gloo in torch 2.14 refuses float16 all_reduce, so the gloo side emulates the hook: the
        # same fp16 rounding before and after, the sum in float32. smddp adds fp16 in float32
        # and rounds once, so for two ranks the two agree bit for bit.
        def emulated_fp16_hook(group, bucket):
            t = bucket.buffer().to(torch.float16).div_(world).float()
            fut = dist.all_reduce(t, group=group, async_op=True).get_future()
            return fut.then(lambda f: bucket.buffer().copy_(f.value()[0].to(torch.float16)))
        m2.register_comm_hook(gloo, emulated_fp16_hook)
    n = 5 + 2 * rank if mode == "ddp_join" else 20  # uneven inputs for Join
    train(m1, batches(n, (10,)), nn.MSELoss(), join=mode == "ddp_join")
    train(m2, batches(n, (10,)), nn.MSELoss(), join=mode == "ddp_join")
    compare([p.detach() for p in m1.parameters()], [p.detach() for p in m2.parameters()], mode,
            rtol=1e-3 if mode == "ddp_hook" else 1e-5, atol=1e-4 if mode == "ddp_hook" else 1e-6)
    # Every rank must end with the same parameters (DDP's invariant).
    flat = torch.cat([p.detach().flatten() for p in m1.parameters()])
    allp = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(allp, flat)
    check(f"{mode}: ranks agree", all(torch.equal(allp[0], x) for x in allp))

elif mode == "ddp_powersgd":
    # PowerSGD's hook waits, inside a future's callback, on an all_reduce it issues there
    # (compute_qs): that callback runs on the thread that completed the first all_reduce, which
    # must then run the nested one itself (it hung before). Same hook over gloo beside it.
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    base = ToyModel()
    init_params = [p.detach().clone() for p in base.parameters()]
    m1, m2 = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base), process_group=gloo)
    for m, group in ((m1, None), (m2, gloo)):
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2)
        m.register_comm_hook(state, powerSGD.powerSGD_hook)
    train(m1, batches(8, (10,)), nn.MSELoss())
    train(m2, batches(8, (10,)), nn.MSELoss())
    compare([p.detach() for p in m1.parameters()], [p.detach() for p in m2.parameters()], mode,
            rtol=1e-3, atol=1e-4)

elif mode == "ddp_cnn":
    base = SmallCNN()
    init_params = [p.detach().clone() for p in base.parameters()]
    m1, m2 = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base), process_group=gloo)
    train(m1, batches(10, (1, 16, 16), classes=10), nn.CrossEntropyLoss())
    train(m2, batches(10, (1, 16, 16), classes=10), nn.CrossEntropyLoss())
    compare([p.detach() for p in m1.parameters()], [p.detach() for p in m2.parameters()], mode)

elif mode in ("fsdp1", "hybrid"):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

    base = ToyModel()
    init_params = [p.detach().clone() for p in base.parameters()]
    if mode == "hybrid":  # 2 "nodes" x (world/2) ranks: shard inside, replicate across
        half = world // 2
        def groups(backend):
            mine = None
            for i in range(2):  # intra-node groups (every rank must create every group)
                g = dist.new_group(list(range(i * half, (i + 1) * half)), backend=backend)
                mine = g if rank // half == i else mine
            inter = None
            for j in range(half):
                g = dist.new_group([j, j + half], backend=backend)
                inter = g if rank % half == j else inter
            return mine, inter
        pg1, pg2 = groups("smddp"), groups("gloo")
        kw1 = dict(process_group=pg1, sharding_strategy=ShardingStrategy.HYBRID_SHARD)
        kw2 = dict(process_group=pg2, sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    else:
        kw1, kw2 = dict(process_group=dist.group.WORLD), dict(process_group=gloo)
    m1 = FSDP(copy.deepcopy(base), use_orig_params=True, device_id=torch.device("cpu"), **kw1)
    m2 = FSDP(copy.deepcopy(base), use_orig_params=True, device_id=torch.device("cpu"), **kw2)
    train(m1, batches(15, (10,)), nn.MSELoss())
    train(m2, batches(15, (10,)), nn.MSELoss())
    with FSDP.summon_full_params(m1), FSDP.summon_full_params(m2):
        compare([p.detach().clone() for p in m1.parameters()], [p.detach().clone() for p in m2.parameters()], mode)

elif mode == "fsdp2":
    from torch.distributed.device_mesh import DeviceMesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard

    base = ToyModel()
    init_params = [p.detach().clone() for p in base.parameters()]
    mesh1 = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    mesh2 = DeviceMesh.from_group(gloo, "cpu")
    m1, m2 = copy.deepcopy(base), copy.deepcopy(base)
    for m, mesh in ((m1, mesh1), (m2, mesh2)):
        fully_shard(m.net1, mesh=mesh)
        fully_shard(m.net2, mesh=mesh)
        fully_shard(m, mesh=mesh)
    train(m1, batches(15, (10,)), nn.MSELoss())
    train(m2, batches(15, (10,)), nn.MSELoss())
    compare([p.full_tensor().detach() for p in m1.parameters()], [p.full_tensor().detach() for p in m2.parameters()],
            mode)
else:
    raise SystemExit(f"unknown mode {mode}")

dist.barrier()
dist.destroy_process_group()
done()
