"""Sparse allreduce over smddp against gloo in the same job (#17): the same bits for every case
(nnz differing by rank, nnz 0, uncoalesced duplicates, hybrid sparse+dense dims, float64), clear
errors for what gloo refuses too, and DDP with nn.Embedding(sparse=True) trained over each
backend ending with identical parameters. Usage: sparse_allreduce.py"""
import copy
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn

import smddp  # noqa: F401
from common import checker

check, done = checker()
dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")


def sparse_case(name):
    g = torch.Generator().manual_seed(100 + rank)
    if name == "vector":  # 1-D, a different nnz on every rank
        n = 3 + 2 * rank
        return torch.sparse_coo_tensor(torch.randint(0, 50, (1, n), generator=g), torch.randn(n, generator=g), (50,))
    if name == "empty_on_rank_1":
        n = 0 if rank == 1 else 4
        return torch.sparse_coo_tensor(torch.randint(0, 8, (2, n), generator=g), torch.randn(n, generator=g), (8, 8))
    if name == "duplicates":  # uncoalesced input: the same index twice
        idx = torch.tensor([[1, 1, 3, rank]])
        return torch.sparse_coo_tensor(idx, torch.randn(4, generator=g, dtype=torch.float64), (10,))
    if name == "hybrid":  # sparse rows of dense vectors, as an embedding's gradient
        n = 2 + rank
        return torch.sparse_coo_tensor(torch.randint(0, 30, (1, n), generator=g), torch.randn(n, 6, generator=g), (30, 6))
    raise ValueError(name)


for name in ("vector", "empty_on_rank_1", "duplicates", "hybrid"):
    a, b = sparse_case(name), sparse_case(name)
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    a, b = a.coalesce(), b.coalesce()
    check(f"{name}: indices as gloo's", torch.equal(a.indices(), b.indices()), f"{a.indices()} vs {b.indices()}")
    check(f"{name}: values bit for bit as gloo's", torch.equal(a.values(), b.values()), f"{a.values()} vs {b.values()}")
    check(f"{name}: a sparse result of the input's shape", a.is_sparse and a.shape == sparse_case(name).shape)

# A plain reference besides gloo: every rank's dense tensor summed here.
ref = torch.zeros(50)
for r in range(world):
    g = torch.Generator().manual_seed(100 + r)
    n = 3 + 2 * r
    idx, val = torch.randint(0, 50, (1, n), generator=g), torch.randn(n, generator=g)
    ref.index_add_(0, idx[0], val)
v = sparse_case("vector")
dist.all_reduce(v)
check("vector: equals the dense sum of all ranks' tensors", torch.allclose(v.to_dense(), ref, atol=1e-6),
      f"max |diff| {(v.to_dense() - ref).abs().max().item()}")

# What gloo refuses is refused with a clear error, and the group goes on.
try:
    dist.all_reduce(sparse_case("vector"), op=dist.ReduceOp.MAX)
    check("MAX on a sparse tensor raises", False, "no error")
except RuntimeError as e:
    check("MAX on a sparse tensor names the rule", "only SUM" in str(e), str(e))
t = torch.ones(4)
dist.all_reduce(t)
check("dense allreduce after the refused one", torch.equal(t, torch.full((4,), float(world))), str(t))

# DDP with a sparse embedding, trained over smddp and over gloo from the same start and data.
torch.manual_seed(0)


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 8, sparse=True)
        self.fc = nn.Linear(8, 1)

    def forward(self, x):
        return self.fc(self.emb(x).mean(1))


base = Bag()
models = {"smddp": nn.parallel.DistributedDataParallel(copy.deepcopy(base)),
          "gloo": nn.parallel.DistributedDataParallel(copy.deepcopy(base), process_group=gloo)}
for backend, model in models.items():
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7 + rank)
    for _ in range(5):
        x = torch.randint(0, 100, (16, 4), generator=g)
        y = torch.randn(16, 1, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        check(f"DDP over {backend}: the embedding's gradient is sparse", model.module.emb.weight.grad.is_sparse)
        opt.step()
sp, gp = list(models["smddp"].parameters()), list(models["gloo"].parameters())
check("DDP sparse embedding: parameters bit for bit as gloo's", all(torch.equal(a, b) for a, b in zip(sp, gp)),
      f"max |diff| {max((a - b).abs().max().item() for a, b in zip(sp, gp))}")
check("DDP sparse embedding: training moved the embedding", not torch.equal(sp[0], base.emb.weight))

dist.destroy_process_group()
done()
