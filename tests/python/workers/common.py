"""Helpers for the worker scripts that torchrun starts in the pytest suite."""
import os
import sys

import torch


def checker():
    """Returns (check, done): check(name, cond, detail) records failures; done() reports and exits."""
    failures = []
    count = [0]
    rank = int(os.environ.get("RANK", "0"))

    def check(name, cond, detail=""):
        count[0] += 1
        if not cond:
            failures.append(f"{name}: {detail}")
            print(f"rank {rank} FAIL {name}: {detail}", flush=True)

    def done():
        if failures:
            print(f"rank {rank} FAILED {len(failures)} of {count[0]} checks", flush=True)
            sys.exit(1)
        print(f"rank {rank} ALL OK {count[0]} checks", flush=True)

    return check, done


def same(a, b, exact):
    """Exact equality for integers/bool, allclose (with NaN equal) for floats."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if exact or not a.is_floating_point() and not a.is_complex():
        return torch.equal(a, b)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(a.dtype, 1e-5)
    return torch.allclose(a.double() if not a.is_complex() else a, b.double() if not b.is_complex() else b,
                          rtol=tol, atol=tol, equal_nan=True)


def check_ddp_against_gloo(ddp_class, gloo, rank, check, steps=5):
    """Trains one small model with `ddp_class` over the default group (smddp) and one over `gloo`,
    from the same start on the same data, and checks their parameters match after `steps`."""
    import copy

    import torch.nn as nn

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    models = {"smddp": ddp_class(copy.deepcopy(base)), "gloo": ddp_class(copy.deepcopy(base), process_group=gloo)}
    for model in models.values():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            inp, tgt = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(model(inp), tgt).backward()
            opt.step()
    for (n, p), q in zip(models["smddp"].module.named_parameters(), models["gloo"].module.parameters()):
        check(f"DDP {n} vs gloo", torch.allclose(p, q, rtol=1e-5, atol=1e-6), (p - q).abs().max().item())
