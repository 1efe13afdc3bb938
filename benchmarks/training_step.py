"""The *_step ops of benchmarks/torch_collectives.py: one training step (forward, backward with
its gradient collectives, optimizer) of a small MLP under DDP (ddp_step) or FSDP1 (fsdp_step),
timed, and its trained parameters checked against the same model trained alone on every rank's
batch (step_reference)."""
import time

STEP_WARMUP, STEP_TIMED = 3, 20


def step_model(width):
    """The *_step ops' MLP, the same initial weights on every rank and in the reference."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def step_batch(rank):
    """Rank `rank`'s batch: its own data, so that the gradients the collectives average differ."""
    import torch
    g = torch.Generator().manual_seed(1 + rank)
    return torch.randn(32, 256, generator=g), torch.randn(32, 10, generator=g)


def step_reference(width, world, steps):
    """The parameters every replica should hold after `steps` steps: the same model trained alone on
    all ranks' batches at once. With equal batches and a mean loss, the gradient DDP and FSDP
    average over the ranks is this batch's gradient, so the two differ only by rounding."""
    import torch
    import torch.nn as nn
    model = step_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [step_batch(r) for r in range(world)]
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def mismatched(params, reference, rtol=1e-4, atol=1e-5):
    """How many elements of `params` are not `reference`'s within rounding (a parameter of another
    shape counts whole)."""
    import torch
    bad = 0
    for p, r in zip(params, reference):
        p = p.detach()
        bad += r.numel() if p.shape != r.shape else int((~torch.isclose(p, r, rtol=rtol, atol=atol)).sum())
    return bad + sum(r.numel() for r in reference[len(params):])


def step_time(op, args, rank, world):
    """End to end: one training step (forward, backward with its gradient collectives, optimizer)
    of a small MLP under DDP (ddp_step) or FSDP1 (fsdp_step); time is the mean over 20 steps. Each
    rank trains on a batch of its own; #wrong counts the parameter elements that, after the last
    step, differ from the same model trained alone on all ranks' batches (step_reference), on the
    rank with the most."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    width = args.step_width
    model = step_model(width)
    params = sum(p.numel() for p in model.parameters())
    wrong = 0
    try:
        if op == "ddp_step":
            model = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = step_batch(rank)

        def step():
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        for _ in range(STEP_WARMUP):
            step()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(STEP_TIMED):
            step()
        dt = (time.perf_counter() - t0) / STEP_TIMED
        reference = step_reference(width, world, STEP_WARMUP + STEP_TIMED)
        if op == "ddp_step":
            wrong = mismatched(list(model.module.parameters()), reference)
        else:
            with FSDP.summon_full_params(model):
                wrong = mismatched(list(model.parameters()), reference)
        t = torch.tensor([dt, float(wrong)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time, the worst rank's count
        dt, wrong, err = t[0].item(), int(t[1].item()), ""
    except (RuntimeError, ValueError, AttributeError) as e:  # e.g. FSDP over mpi: no reduce_scatter
        dt, wrong, err = float("nan"), 0, str(e).splitlines()[0][:80]
    if rank == 0:
        print(f"\r  {args.backend:6} {op:15} {params * 4:>10} B  {dt * 1e6:>12.1f} us", end="", flush=True)
        return [{"backend": args.backend, "op": op, "world": world, "bytes": params * 4, "time_us": dt * 1e6,
                 "algbw": float("nan"), "busbw": float("nan"), "wrong": wrong, "error": err, "mode": args.mode,
                 "cpu_us": float("nan")}]
    return []
