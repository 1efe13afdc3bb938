"""A small DDP training job on synthetic data: the smddp demo (examples/demo.sh runs it twice,
with backend smddp and with gloo). The only smddp-specific lines are the two marked below.

    torchrun --nproc_per_node=4 examples/train_ddp.py --backend smddp
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--backend", default="smddp")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--samples", type=int, default=8192)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--width", type=int, default=512)
p.add_argument("--json", help="write the throughput here (rank 0)")
args = p.parse_args()

if args.backend == "smddp":
    import smddp  # noqa: F401   <- smddp line 1 of 2
dist.init_process_group(backend=args.backend)  # <- line 2: backend="smddp"
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)

# Synthetic regression task: y = f(x) for a fixed random MLP, plus noise.
g = torch.Generator().manual_seed(1234)
x = torch.randn(args.samples, 64, generator=g)
teacher = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 10))
with torch.no_grad():
    y = teacher(x) + 0.01 * torch.randn(args.samples, 10, generator=g)
data = TensorDataset(x, y)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=args.batch, sampler=sampler)

model = DDP(nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 10)))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
params = sum(p.numel() for p in model.parameters())
if rank == 0:
    print(f"[{args.backend}] {world} processes, model {params / 1e6:.2f} M parameters "
          f"({params * 4 / 2**20:.1f} MiB of gradients per step), {args.samples} samples", flush=True)

total_samples, total_time, last_loss = 0, 0.0, float("nan")
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    dist.barrier()
    t0 = time.perf_counter()
    seen, loss_sum = 0, torch.zeros(1)
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        loss_sum += loss.detach() * len(xb)
        seen += len(xb)
    dist.barrier()
    dt = time.perf_counter() - t0
    stats = torch.tensor([loss_sum.item(), float(seen)])
    dist.all_reduce(stats)
    if epoch > 0:  # the first epoch warms up (allocations, connections)
        total_samples += int(stats[1].item())
        total_time += dt
    last_loss = stats[0].item() / stats[1].item()
    if rank == 0:
        print(f"[{args.backend}] epoch {epoch}: loss {stats[0].item() / stats[1].item():.5f}, "
              f"{stats[1].item() / dt:,.0f} samples/s", flush=True)

if rank == 0:
    rate = total_samples / total_time if total_time else float("nan")
    print(f"[{args.backend}] throughput {rate:,.0f} samples/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "samples_per_s": rate, "world": world, "loss": last_loss}, f)
dist.destroy_process_group()
