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
