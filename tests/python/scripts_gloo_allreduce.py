# Started by torchrun: a gloo all_reduce whose result every rank checks and prints.
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.arange(5, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
expected = torch.arange(5, dtype=torch.float32) * (world * (world + 1) / 2)
assert torch.equal(t, expected), (t, expected)
print(f"rank {rank}/{world} ok {t.tolist()}", flush=True)
dist.destroy_process_group()
