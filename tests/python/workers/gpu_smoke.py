"""One rank, no launcher: import smddp, init_process_group, a CPU and two CUDA allreduces, an
allgather. tools/gpu-check runs it before the PyTorch half of the GPU suite, so that a crash of
the extension itself shows where it happened (faulthandler's Python stack; gpu-check adds a
native backtrace from cuda-gdb when it has one) instead of only a dead rank under torchrun."""
import faulthandler
import os

faulthandler.enable()
for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
    os.environ.setdefault(k, v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import smddp  # noqa: E402,F401


def say(*a):
    print("gpu-smoke:", *a, flush=True)


say("torch", torch.__version__, "cuda", torch.version.cuda, "smddp from", smddp.__file__)
dist.init_process_group("smddp")
say("init_process_group ok")
t = torch.ones(4)
dist.all_reduce(t)
assert t.tolist() == [1.0] * 4, t
for n in (2, 1 << 20):
    g = torch.full((n,), 3.0, device="cuda")
    dist.all_reduce(g)
    torch.cuda.synchronize()
    assert bool((g == 3.0).all()), g[:4]
    say(f"cuda allreduce of {n} floats ok")
o = torch.empty(8, device="cuda")
dist.all_gather_into_tensor(o, torch.arange(8.0, device="cuda"))
assert o.cpu().tolist() == list(range(8)), o
dist.destroy_process_group()
say("ALL OK")
