"""Collective sweep through torch.distributed for several backends in one invocation.

    python3 benchmarks/torch_collectives.py --np 4 --backends smddp,gloo,mpi \
        --ops allreduce,allgather,reduce_scatter --min 8 --max 64M --out build/bench

Runs the same job once per backend with the same number of processes on this node (torchrun
for smddp and gloo, mpirun for torch's mpi backend), checks every result (#wrong), and writes
<out>/results.csv, <out>/results.md and one PNG per collective (busbw and latency vs size, log
axes). `--memcpy` adds the single-core memcpy bandwidth over the same sizes (the ceiling of a
shared-memory transport), measured by this script too. Sizes follow nccl-tests: bytes of the
largest buffer; busbw uses nccl-tests' factors. `--rounds N` runs every backend N times, their
order flipping each round, and reports each point's median: on a small shared machine one run of
a backend can fall in a slow spell the others missed (docs/performance.md).
`--device cuda` puts the tensors on the GPUs (rank r on GPU r % count) and syncs the device
around every timing: run it with `--backends smddp,nccl` on a GPU machine for NCCL beside smddp
(the *_step ops stay on the CPU).

`--contention 1,unset,hog` runs every backend three ways, as training jobs run: OMP_NUM_THREADS=1
(what torchrun sets), OMP_NUM_THREADS unset (what mpirun, srun and SageMaker's MPI launcher
leave: torch's intra-op pool gets one thread per core), and OMP_NUM_THREADS=1 with one busy
process per core beside the ranks (standing in for dataloader workers). Each row also carries
the CPU time the ranks spent (user+sys, all ranks together) per operation, so cost is seen
beside speed. `--compute N` runs a parallel ATen operation on N float32 elements before every
timed collective (torch's OpenMP pool wakes, as between a model's layers) and times the
collectives alone and whole iterations: where the pool has a thread per core, its threads spin
after each such operation on the cores the collective needs (#18). CPU time is not reported then.

Rank 0 reads the core-to-core probe (`core-to-core`, benchmarks/core_to_core.h) just before and
just after each row's timed loop (columns c2c_before_ns, c2c_after_ns): on a VM the host moves the
vCPUs between one core complex and two, and every shared-memory time follows (2-3x,
docs/performance.md). The report counts, per backend and mode, how many readings were near (within
2x of the run's lowest). `--c2c PATH` names the probe (default: $SMDDP_CORE_TO_CORE, else this
tree's build/*/benchmarks/core-to-core, build/host's first; without one the readings are NaN).
"""
import argparse
import csv
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from training_step import step_time  # noqa: E402  (beside this script: run as one, or via targets.py's path)

BUS = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "alltoall": lambda n: (n - 1) / n}


def parse_size(s):
    s = s.strip().upper()
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if mul > 1 else s) * mul)


def sizes(lo, hi, factor):
    """lo, lo*factor, ... and always hi itself (so "8 B to 64 MiB" ends at 64 MiB)."""
    out, s = [], lo
    while s < hi:
        out.append(s)
        s = max(s + 1, int(s * factor))
    return out + [hi]


C2C_NEAR = 2.0  # a probe reading within this factor of the run's lowest: the vCPUs sat close


def core_to_core_ns(path):
    """One reading of the probe (ns one way between the first two CPUs), NaN without one."""
    if not path:
        return float("nan")
    try:
        return float(subprocess.run([path], capture_output=True, text=True, timeout=30).stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return float("nan")


def probe_lines(rows, modes, backends):
    """Per backend and mode: how many of its rows' probe readings were near (within C2C_NEAR of
    the lowest reading of the run), and their range. Nothing when the probe never read."""
    readings = {}
    for r in rows:
        for k in ("c2c_before_ns", "c2c_after_ns"):
            v = r.get(k, float("nan"))
            if v == v and v > 0:
                readings.setdefault((r["backend"], r.get("mode", "1")), []).append(v)
    if not readings:
        return []
    low = min(min(v) for v in readings.values())
    lines = ["\n## Core-to-core probe\n",
             "Rank 0 read the probe (benchmarks/core_to_core.h) before and after each row's timed loop, the other "
             f"ranks waiting. Near: within {C2C_NEAR:g}x of the run's lowest reading ({low:.0f} ns).\n",
             "| backend | mode | near readings | ns, lowest–highest |", "|---|---|---|---|"]
    for b in backends:
        for m in modes:
            v = readings.get((b, m))
            if v:
                near = sum(x <= C2C_NEAR * low for x in v)
                lines.append(f"| {b} | {m} | {near} of {len(v)} | {min(v):.0f}–{max(v):.0f} |")
    return lines


def iters_for(nbytes, base):
    # Enough repetitions for a stable small-message time without spending minutes on 64 MiB.
    return max(3, min(base, int(2e8 // max(nbytes, 1))))


def iters_for_time(dt, row_time, max_iters):
    """--row-time: iterations of `dt` seconds each that fill `row_time`, 3 to `max_iters`."""
    return int(max(3, min(max_iters, row_time / dt if dt > 0 else max_iters)))


# ------------------------------------------------------------------------------------------------
def calibrated_iters(warm_dt, args, dev):
    """--row-time: as many timed iterations as fill that many seconds at the warm-up's pace (the
    slowest rank's), between 3 and --max-iters, the same on every rank. A fixed count times a fast
    backend's small messages for a few milliseconds, less than one of the scheduler's time slices
    when ranks share cores, and a slow one's for seconds."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([warm_dt], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return iters_for_time(t.item(), args.row_time, args.max_iters)


def settle(seconds, dev):
    """--settle: small allreduces for `seconds` before the first point, in blocks of 20 whose end
    every rank agrees on (the slowest rank's clock), so that all loop the same count. The first
    tenths of a second after the ranks start run slow for every backend (at w=4 on 2 cores, 8-byte
    allreduce blocks of 3000 read 1.3-2x their later time for smddp and Open MPI alike: the
    launcher's and the other ranks' start-up still share the cores), which the sweep's first
    point would otherwise carry alone."""
    import torch
    import torch.distributed as dist
    x = torch.zeros(2, device=dev)
    t0 = time.perf_counter()
    while True:
        for _ in range(20):
            dist.all_reduce(x)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if t.item() >= seconds:
            return


def placed(t, offset):
    """t's values in a view `offset` elements into a new buffer (offset 0: a plain copy)."""
    import torch
    base = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = base[offset:]
    view.copy_(t)
    return view


def worker(args):
    if args.omp_unset:
        # Before torch (and libgomp) read it: torchrun sets it to 1 when it is missing.
        os.environ.pop("OMP_NUM_THREADS", None)
    import resource

    import torch
    import torch.distributed as dist

    if args.backend == "smddp":
        import smddp  # noqa: F401
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cpu")
    if args.device == "cuda":  # ranks share the GPUs there are; nccl's calls are asynchronous,
        dev = torch.device("cuda", rank % torch.cuda.device_count())  # so every timing syncs
        torch.cuda.set_device(dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    compute = torch.ones(parse_size(args.compute), device=dev) if parse_size(args.compute) else None
    results = []
    if args.settle > 0:
        settle(args.settle, dev)
    for op in args.ops.split(","):
        if op.endswith("_step"):
            results += step_time(op, args, rank, world)
            continue
        for nbytes in sizes(parse_size(args.min), parse_size(args.max), args.factor):
            count = max(1, nbytes // 4)
            if op in ("allgather", "reduce_scatter", "alltoall"):
                count = max(1, count // world) * world  # whole blocks
            blk = count // world if op in ("allgather", "reduce_scatter", "alltoall") else count
            if op in ("allgather", "reduce_scatter", "alltoall") and blk == 0:
                continue
            x = ((torch.arange(count, dtype=torch.float32) % 7) + rank).to(dev)
            if op == "allreduce":
                buf = placed(x, args.offset)
                run = lambda: dist.all_reduce(buf)  # noqa: E731
                expect = lambda: (torch.arange(count, dtype=torch.float32) % 7) * world + world * (world - 1) / 2  # noqa
                result = lambda: buf  # noqa: E731
                reset = lambda: buf.copy_(x)  # noqa: E731
            elif op == "allgather":
                inp, out = placed(x[:blk], args.offset), placed(torch.empty(blk * world, device=dev), args.offset)
                if args.backend == "mpi":  # torch's mpi backend has only the list form
                    outs = list(out.chunk(world))
                    run = lambda: dist.all_gather(outs, inp)  # noqa: E731
                else:
                    run = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
                expect = lambda: torch.cat([(torch.arange(blk, dtype=torch.float32) % 7) + r for r in range(world)])  # noqa
                result = lambda: out  # noqa: E731
                reset = lambda: out.fill_(float("nan"))  # noqa: E731  (the timed loop left the answer there)
            elif op == "reduce_scatter":
                x, out = placed(x, args.offset), placed(torch.empty(blk, device=dev), args.offset)
                run = lambda: dist.reduce_scatter_tensor(out, x)  # noqa: E731
                expect = lambda: ((torch.arange(count, dtype=torch.float32) % 7) * world + world * (world - 1) / 2)[rank * blk:(rank + 1) * blk]  # noqa
                result = lambda: out  # noqa: E731
                reset = lambda: out.fill_(float("nan"))  # noqa: E731  (the timed loop left the answer there)
            elif op == "broadcast":
                buf = placed(x, args.offset)
                run = lambda: dist.broadcast(buf, src=0)  # noqa: E731
                expect = lambda: (torch.arange(count, dtype=torch.float32) % 7)  # noqa: E731
                result = lambda: buf  # noqa: E731
                reset = lambda: buf.copy_(x)  # noqa: E731
            else:  # alltoall
                out = torch.empty(count, device=dev)
                run = lambda: dist.all_to_all_single(out, x)  # noqa: E731
                expect = lambda: torch.cat([((torch.arange(count, dtype=torch.float32) % 7) + r)[rank * blk:(rank + 1) * blk] for r in range(world)])  # noqa
                result = lambda: out  # noqa: E731
                reset = lambda: out.fill_(float("nan"))  # noqa: E731  (the timed loop left the answer there)
            try:
                n = iters_for(count * 4, args.iters)
                # Small messages: warm up longer (first touches, thread wake-ups, caches).
                warm = max(args.warmup, min(50, n // 4))
                paced = max(1, warm // 2) if args.row_time > 0 else 0  # the warm-up's last ones, timed
                for _ in range(max(0, warm - paced)):
                    run()
                sync()
                t0 = time.perf_counter()
                for _ in range(paced):
                    run()
                sync()
                if paced:
                    n = calibrated_iters((time.perf_counter() - t0) / paced, args, dev)
                c2c_before = core_to_core_ns(args.c2c) if rank == 0 else float("nan")  # the others wait
                dist.barrier()
                ru0 = resource.getrusage(resource.RUSAGE_SELF)
                it = float("nan")
                if compute is None:
                    t0 = time.perf_counter()
                    for _ in range(n):
                        run()
                    sync()
                    dt = (time.perf_counter() - t0) / n
                else:
                    # The collectives timed alone (the operation before each wakes the pool; a
                    # collective also waits for the slower rank's operation), and whole iterations.
                    dt = 0.0
                    t_all = time.perf_counter()
                    for _ in range(n):
                        compute.mul_(1.0000001)
                        sync()
                        t0 = time.perf_counter()
                        run()
                        sync()
                        dt += time.perf_counter() - t0
                    dt /= n
                    it = (time.perf_counter() - t_all) / n
                ru1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu = (ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime) / n
                if compute is not None:
                    cpu = float("nan")  # the operations' CPU time is in it
                reset()
                run()
                sync()
                wrong = int((result().cpu() != expect()).sum().item())
                t = torch.tensor([dt, float(wrong), it], dtype=torch.float64, device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                dt, wrong, it = t[0].item(), int(t[1].item()), t[2].item()
                c = torch.tensor([cpu], dtype=torch.float64, device=dev)
                dist.all_reduce(c)  # CPU of all ranks together
                cpu = c.item()
                err = ""
                c2c_after = core_to_core_ns(args.c2c) if rank == 0 else float("nan")
                dist.barrier()  # the others wait for the probe before the next row's warm-up
            except RuntimeError as e:  # a peer lacks the collective (mpi: reduce_scatter)
                if args.backend == "smddp":
                    raise  # ours failing is a failure of the run, not a missing cell
                dt, wrong, cpu, it, err = float("nan"), 0, float("nan"), float("nan"), str(e).splitlines()[0][:80]
                n = 0  # nothing was timed
                c2c_before = c2c_after = float("nan")
                dist.barrier()
            if rank == 0:
                algbw = count * 4 / dt / 1e9 if dt == dt else float("nan")
                results.append({"backend": args.backend, "op": op, "world": world, "bytes": count * 4,
                                "iters": n, "time_us": dt * 1e6, "algbw": algbw, "busbw": algbw * BUS[op](world),
                                "wrong": wrong, "error": err, "mode": args.mode, "cpu_us": cpu * 1e6,
                                "iter_us": it * 1e6, "c2c_before_ns": c2c_before, "c2c_after_ns": c2c_after})
                print(f"\r  {args.backend:6} {op:15} {count * 4:>10} B  {dt * 1e6:>12.1f} us", end="", flush=True)
    if rank == 0:
        print(flush=True)
        with open(args.out_json, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def memcpy_rows(szs, iters, row_time=0, max_iters=20000):
    import torch
    rows = []
    torch.set_num_threads(1)
    for nbytes in szs:
        a, b = torch.empty(max(1, nbytes // 4)), torch.empty(max(1, nbytes // 4))
        n = iters_for(nbytes, iters)
        for _ in range(3):
            b.copy_(a)
        if row_time > 0:  # as the collectives' rows (--row-time)
            t0 = time.perf_counter()
            b.copy_(a)
            n = iters_for_time(time.perf_counter() - t0, row_time, max_iters)
        t0 = time.perf_counter()
        for _ in range(n):
            b.copy_(a)
        dt = (time.perf_counter() - t0) / n
        rows.append({"backend": "memcpy", "op": "limit", "world": 1, "bytes": a.numel() * 4, "time_us": dt * 1e6,
                     "algbw": a.numel() * 4 / dt / 1e9, "busbw": a.numel() * 4 / dt / 1e9, "wrong": 0, "error": "",
                     "mode": "1", "cpu_us": dt * 1e6, "iters": n})
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def driver(args):
    os.makedirs(args.out, exist_ok=True)
    rows = []
    me = os.path.abspath(__file__)
    common = ["--worker", "--device", args.device, "--ops", args.ops, "--smallest", args.min, "--largest", args.max,
              "--factor", str(args.factor), "--iters", str(args.iters), "--warmup", str(args.warmup),
              "--row-time", str(args.row_time), "--max-iters", str(args.max_iters), "--settle", str(args.settle),
              "--step-width", str(args.step_width), "--offset", str(args.offset), "--compute", str(args.compute),
              f"--c2c={args.c2c}"]  # one argument: a launcher may drop an empty one
    env = dict(os.environ, OMP_NUM_THREADS="1")
    failed = set()
    modes, backends = args.contention.split(","), args.backends.split(",")
    for mode in modes:
        if mode not in ("1", "unset", "hog"):
            raise SystemExit(f"--contention: unknown mode {mode!r} (known: 1, unset, hog)")
    # Rounds outside, then modes, backends inside: the backends of one mode run back to back, so a
    # change in the machine's background load shows in every backend of that table alike; with
    # several rounds the backends' order flips every round and each point is the median.
    # --paired swaps the inner two: each backend runs its modes back to back, so a mode's ratio to
    # OMP_NUM_THREADS=1 is taken within seconds, per round. The modes rotate by one each round
    # (not flip: with three, flipping keeps the middle one in the middle), since on this machine
    # the second of two back-to-back runs was often the slower one.
    def schedule(rnd):
        order = backends[::-1] if rnd % 2 else backends
        if args.paired:
            k = rnd % len(modes)
            return [(m, b) for b in order for m in modes[k:] + modes[:k]]
        return [(m, b) for m in modes for b in order]

    for rnd in range(args.rounds):
        for mode, backend in schedule(rnd):
            if (backend, mode) in failed:
                continue
            try:
                rows += [dict(r, round=rnd) for r in run_backend(backend, mode, me, common, env, args)]
            except SystemExit as e:
                if backend == "smddp" or not args.peers_may_fail:
                    raise
                # A peer that cannot run here (NCCL with two ranks on one GPU refuses:
                # "Duplicate GPU detected") is reported in the table instead of ending
                # smddp's numbers.
                failed.add((backend, mode))
                args.failed.append(f"{backend} (OMP_NUM_THREADS{MODE_TITLE[mode]}): {e}; its stderr is above")
        if args.memcpy:
            rows += [dict(r, round=rnd) for r in
                     memcpy_rows(sizes(parse_size(args.min), parse_size(args.max), args.factor), args.iters,
                                 args.row_time, args.max_iters)]
    # A peer that failed in some round is not measured in its mode at all (its earlier rounds'
    # rows would be a median of fewer runs, under a header that says it was not measured).
    rows = [r for r in rows if (r["backend"], r.get("mode", "1")) not in failed]
    per_round, rounds_csv = None, os.path.join(args.out, "results_rounds.csv")
    if args.rounds > 1:
        per_round = rows
        write_csv(rounds_csv, rows)
        rows = median_rows(rows)
    else:
        rows = [{k: v for k, v in r.items() if k != "round"} for r in rows]
        if os.path.exists(rounds_csv):  # an earlier run's, which targets.py would read instead
            os.unlink(rounds_csv)
    write_outputs(rows, args, per_round)
    bad = [r for r in rows if r["wrong"]]
    if bad:
        raise SystemExit(f"{len(bad)} results had wrong elements: {bad[:3]}")


def median_rows(rows):
    """One row per point: the median time over the rounds (bandwidths follow it), the median CPU
    time, every round's wrong elements added up and their errors kept."""
    groups = {}
    for r in rows:
        groups.setdefault((r["backend"], r["op"], r["world"], r["bytes"], r.get("mode", "1")), []).append(r)
    out = []
    for rs in groups.values():
        ok = [r for r in rs if r["time_us"] == r["time_us"]]
        m = dict(ok[0] if ok else rs[0])
        m.pop("round", None)
        m["wrong"] = sum(r["wrong"] for r in rs)
        m["error"] = "; ".join(sorted({r["error"] for r in rs if r.get("error")}))
        if ok:
            t = statistics.median(r["time_us"] for r in ok)
            scale = ok[0]["time_us"] / t
            m.update(time_us=t, algbw=ok[0]["algbw"] * scale, busbw=ok[0]["busbw"] * scale)
            cpus = [r.get("cpu_us", float("nan")) for r in ok]
            cpus = [c for c in cpus if c == c]
            m["cpu_us"] = statistics.median(cpus) if cpus else float("nan")
            if all(isinstance(r.get("iters"), int) for r in ok):
                m["iters"] = int(statistics.median(r["iters"] for r in ok))
            its = [r.get("iter_us", float("nan")) for r in ok]
            its = [i for i in its if i == i]
            m["iter_us"] = statistics.median(its) if its else float("nan")
        # One round's probe readings would pass for the median's: they stay in results_rounds.csv.
        m.update(c2c_before_ns=float("nan"), c2c_after_ns=float("nan"))
        out.append(m)
    return out


def start_hogs():
    """One busy process per core, as dataloader workers or a preprocessing job beside training."""
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]


def run_backend(backend, mode, me, common, env, args):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out_json = tmp.name
    extra = ["--mode", mode] + (["--omp-unset"] if mode == "unset" else [])
    if backend == "mpi":
        e = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                 OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd = ["mpirun", "-np", str(args.np), "--bind-to", "none", "--map-by", ":OVERSUBSCRIBE", sys.executable, me,
               "--backend", "mpi", "--out-json", out_json] + common + extra
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.np}",
               f"--master_port={free_port()}", me, "--backend", backend, "--out-json", out_json] + common + extra
        e = env
    print(f"== {backend} (OMP_NUM_THREADS{MODE_TITLE[mode]}): {' '.join(cmd[:6])} ...", flush=True)
    hogs = start_hogs() if mode == "hog" else []
    try:
        p = subprocess.run(cmd, env=e, stderr=subprocess.PIPE, text=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{backend} run failed")
    with open(out_json) as f:
        rows = json.load(f)
    os.unlink(out_json)
    return rows


MODE_TITLE = {"1": "=1", "unset": " unset", "hog": "=1, one busy process per core beside the ranks"}


def mode_tables(rows, mode, backends, lim, args):
    """The markdown tables of one contention mode (mode None: the only one, no title suffix)."""
    sfx = f", OMP_NUM_THREADS{MODE_TITLE[mode]}" if mode else ""
    lines = []
    for op in [o for o in args.ops.split(",") if o.endswith("_step")]:
        lines.append(f"\n## {op}{sfx}: training step time (ms), MLP with {{}} B of gradients\n".replace(
            "{}", str(next((r["bytes"] for r in rows if r["op"] == op), "?"))))
        lines.append("| backend | step (ms) | vs smddp |")
        lines.append("|---|---|---|")
        st = {r["backend"]: r for r in rows if r["op"] == op}
        for b in backends:
            r = st.get(b)
            ok = r and r["time_us"] == r["time_us"]
            ratio = (f"{r['time_us'] / st['smddp']['time_us']:.2f}x" if ok and "smddp" in st
                     and st["smddp"]["time_us"] == st["smddp"]["time_us"] else "n/a")
            lines.append(f"| {b} | {r['time_us'] / 1e3:.2f} | {ratio} |" if ok else
                         f"| {b} | n/a ({(r or {}).get('error', '')}) | n/a |")
    for op in [o for o in args.ops.split(",") if not o.endswith("_step")]:
        # With --compute the third column is the whole iteration (operation and collective).
        per_iter = bool(parse_size(getattr(args, "compute", "0")))
        what = "µs per iteration, the operation and the collective" if per_iter else "CPU µs per op summed over ranks"
        third = "iteration µs" if per_iter else "CPU µs"
        lines.append(f"\n## {op}{sfx} (busbw GB/s, time µs, {what})\n")
        hdr = "| size (B) | " + " | ".join(f"{b} busbw | {b} µs | {b} {third}" for b in backends)
        hdr += " | smddp/gloo | smddp/mpi |" if "smddp" in backends else " |"
        if lim:
            hdr = hdr.rstrip(" |") + " | memcpy GB/s | smddp/limit |"
        lines.append(hdr)
        lines.append("|" + "---|" * (hdr.count("|") - 1))
        by = {(r["backend"], r["bytes"]): r for r in rows if r["op"] == op}
        for nbytes in sorted({r["bytes"] for r in rows if r["op"] == op}):
            cells = []
            for b in backends:
                r = by.get((b, nbytes))
                cpu = r.get("iter_us" if per_iter else "cpu_us", float("nan")) if r else float("nan")
                cells += (["n/a"] * 3 if not r or r["time_us"] != r["time_us"] else
                          [f"{r['busbw']:.3f}", f"{r['time_us']:.1f}", f"{cpu:.1f}" if cpu == cpu else "n/a"])
            row = f"| {nbytes} | " + " | ".join(cells)
            if "smddp" in backends:
                s = by.get(("smddp", nbytes))
                for peer in ("gloo", "mpi"):
                    o = by.get((peer, nbytes))
                    ok = s and o and s["time_us"] == s["time_us"] and o["time_us"] == o["time_us"]
                    row += f" | {o['time_us'] / s['time_us']:.2f}x" if ok else " | n/a"
            if lim:
                s_ok = "smddp" in backends and by.get(("smddp", nbytes)) and by[("smddp", nbytes)]["busbw"] == by[("smddp", nbytes)]["busbw"]
                row += f" | {lim[nbytes]['algbw']:.2f}" if nbytes in lim else " | n/a"
                row += (f" | {by[('smddp', nbytes)]['busbw'] / lim[nbytes]['algbw']:.2f}"
                        if nbytes in lim and s_ok else " | n/a")
            lines.append(row + " |")
    return lines


def read_rows(path):
    """The rows of a results.csv this script wrote, typed as it made them."""
    with open(path) as f:
        return [dict(r, world=int(r["world"]), bytes=int(r["bytes"]), time_us=float(r["time_us"]),
                     algbw=float(r["algbw"]), busbw=float(r["busbw"]), wrong=int(r["wrong"]),
                     mode=r.get("mode") or "1", cpu_us=float(r.get("cpu_us") or "nan"),
                     iter_us=float(r.get("iter_us") or "nan"),
                     c2c_before_ns=float(r.get("c2c_before_ns") or "nan"),
                     c2c_after_ns=float(r.get("c2c_after_ns") or "nan"),
                     **({"iters": int(r["iters"])} if r.get("iters") not in (None, "") else {}),
                     **({"round": int(r["round"])} if r.get("round") not in (None, "") else {}))
                for r in csv.DictReader(f)]


def write_csv(path, rows):
    fields = ["backend", "op", "world", "bytes", "time_us", "algbw", "busbw", "wrong", "error", "mode", "cpu_us",
              "iter_us", "c2c_before_ns", "c2c_after_ns", "iters", "round"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def paired_tables(per_round, modes, backends, args):
    """Per round, each mode's time over the same backend's OMP_NUM_THREADS=1 time, and Open MPI's
    and gloo's over smddp's in the same mode: the median over rounds, then the lowest and highest.
    A slow spell of the machine that spans one round moves both sides of its ratios alike."""
    def spread(values):
        if not values:
            return "n/a"
        return f"{statistics.median(values):.2f}x ({min(values):.2f}–{max(values):.2f})"

    by = {(r["round"], r["backend"], r["op"], r.get("mode", "1"), r["bytes"]): r["time_us"] for r in per_round
          if r["time_us"] == r["time_us"] and not r.get("error") and not r["wrong"]}
    rounds = sorted({k[0] for k in by})
    lines = []
    for op in [o for o in args.ops.split(",") if not o.endswith("_step")]:
        lines.append(f"\n## {op}, paired within each round (median over {len(rounds)} rounds, lowest–highest)\n")
        cols = [(f"{b} {m}/=1", b, m, None) for m in modes if m != "1" and "1" in modes
                for b in backends if b != "memcpy"]
        cols += [(f"{p}/smddp, {m}", p, m, "smddp") for m in modes for p in backends if p not in ("smddp", "memcpy")
                 and "smddp" in backends]
        lines.append("| size (B) | " + " | ".join(c[0] for c in cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for nbytes in sorted({k[4] for k in by if k[2] == op}):
            cells = []
            for _, b, m, over in cols:
                vals = []
                for k in rounds:
                    num = by.get((k, b, op, m, nbytes))
                    den = by.get((k, over or b, op, m if over else "1", nbytes))
                    if num is not None and den:
                        vals.append(num / den)
                cells.append(spread(vals))
            lines.append(f"| {nbytes} | " + " | ".join(cells) + " |")
    return lines


def write_outputs(rows, args, per_round=None):
    write_csv(os.path.join(args.out, "results.csv"), rows)
    backends = [b for b in args.backends.split(",")]
    modes = [m for m in args.contention.split(",")]
    lim = {r["bytes"]: r for r in rows if r["backend"] == "memcpy"}
    lines = [f"# torch.distributed collectives, {args.np} processes on one node\n"]
    if getattr(args, "rounds", 1) > 1:
        lines.append(f"Each point: the median of {args.rounds} runs of each backend, their order alternating"
                     + ("; each backend ran its modes back to back, their order rotating (`--paired`).\n" if getattr(args, "paired", False)
                        else ".\n"))
    if getattr(args, "row_time", 0) > 0:
        lines.append(f"Each point's timed loop ran as many iterations as fill {args.row_time:g} s at its warm-up's "
                     f"pace (the slowest rank's), 3 to {args.max_iters} (column `iters` of results.csv).\n")
    if getattr(args, "settle", 0) > 0:
        lines.append(f"Every run first did {args.settle:g} s of 8-byte allreduces, past its ranks' start-up.\n")
    if getattr(args, "offset", 0):
        lines.append(f"Every tensor is a view {args.offset} float32 elements ({4 * args.offset} bytes) into its "
                     "buffer, off torch's 64-byte alignment.\n")
    if parse_size(getattr(args, "compute", "0")):
        lines.append(f"Before every timed collective each rank multiplied a tensor of {args.compute} float32 "
                     "elements in place (torch's intra-op pool wakes, as between a model's layers). µs: the "
                     "collectives alone, which includes waiting for the slower rank's operation; iteration µs: "
                     "the operation and the collective. CPU time is not reported.\n")
    lines += [f"Not measured: {f}" for f in args.failed]
    for mode in modes:
        lines += mode_tables([r for r in rows if r.get("mode", "1") == mode and r["backend"] != "memcpy"],
                             mode if len(modes) > 1 else None, backends, lim, args)
    if per_round and (len(modes) > 1 or len(backends) > 1):
        lines += paired_tables(per_round, modes, backends, args)
    lines += probe_lines(per_round or rows, modes, backends)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots", file=sys.stderr)
        return
    for op in [o for o in args.ops.split(",") if not o.endswith("_step")]:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for b, mode in [(b, m) for m in modes for b in backends] + ([("memcpy", "1")] if lim else []):
            rs = sorted((r for r in rows if r["backend"] == b and (r["op"] == op or b == "memcpy")
                         and r.get("mode", "1") == mode and r["time_us"] == r["time_us"]), key=lambda r: r["bytes"])
            if not rs:
                continue
            xs = [r["bytes"] for r in rs]
            label = b if len(modes) == 1 or b == "memcpy" else f"{b}, OMP {mode}"
            a1.plot(xs, [r["busbw"] for r in rs], marker="o", label=label, linestyle="--" if b == "memcpy" else "-")
            if b != "memcpy":
                a2.plot(xs, [r["time_us"] for r in rs], marker="o", label=label)
        for a, t in ((a1, "bus bandwidth (GB/s)"), (a2, "time (µs)")):
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            a.set_xlabel("message size (bytes)")
            a.set_ylabel(t)
            a.grid(True, which="both", alpha=0.3)
            a.legend()
        fig.suptitle(f"{op}, {args.np} processes, one node")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, f"{op}_np{args.np}.png"), dpi=110)
        plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--backends", default="smddp,gloo,mpi")
    ap.add_argument("--ops", default="allreduce,allgather,reduce_scatter")
    # --smallest/--largest: the spellings passed to the workers, since torchrun in torch 2.11 takes
    # "--max" after the script for an abbreviation of its own --max-restarts (and fails)
    ap.add_argument("--min", "--smallest", dest="min", default="8")
    ap.add_argument("--max", "--largest", dest="max", default="64M")
    ap.add_argument("--factor", type=float, default=4)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--row-time", type=float, default=0,
                    help="seconds each point's timed loop should take: its iterations are set from the warm-up's "
                         "pace (slowest rank), 3 to --max-iters, instead of from --iters (default 0: --iters)")
    ap.add_argument("--max-iters", type=int, default=20000, help="the most iterations --row-time may set")
    ap.add_argument("--settle", type=float, default=None,
                    help="seconds of small allreduces every run does before its first point, past the ranks' "
                         "start-up (default 0.5; 0: none; with --from-csv, what the runs did, for the report)")
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--memcpy", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every backend this many times, alternating their order; report each point's median")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the tensors are; cuda: compare with --backends smddp,nccl (ranks share the GPUs)")
    ap.add_argument("--step-width", type=int, default=1024, help="hidden width of the *_step model")
    ap.add_argument("--compute", default="0",
                    help="before every timed collective, a parallel ATen operation on this many float32 "
                         "elements (torch's intra-op pool wakes, as between a model's layers); the "
                         "collectives are timed alone and with it (default 0: none)")
    ap.add_argument("--offset", type=int, default=0,
                    help="place every collective's tensors this many float32 elements into a larger buffer "
                         "(views off a cache line, as FSDP shards and slices are; default 0: torch's own "
                         "64-byte-aligned tensors)")
    ap.add_argument("--contention", default="1",
                    help="comma list of 1 (OMP_NUM_THREADS=1), unset (torch's default pool), hog (=1 plus a busy "
                         "process per core)")
    ap.add_argument("--paired", action="store_true",
                    help="each backend runs its --contention modes back to back (their order rotating each round) "
                         "instead of each mode's backends; with --rounds N the report adds per-round ratios")
    ap.add_argument("--c2c", default=None,
                    help="the core-to-core probe to run beside each row (default: $SMDDP_CORE_TO_CORE, else "
                         "this tree's build/*/benchmarks/core-to-core; '' for none)")
    ap.add_argument("--mode", default="1", help=argparse.SUPPRESS)
    ap.add_argument("--omp-unset", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peers-may-fail", action="store_true",
                    help="a peer backend that fails is listed as not measured instead of ending the run")
    ap.add_argument("--from-csv", action="store_true", help="rewrite the table and plots from <out>/results.csv")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--out-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.failed = []  # peers that could not run (driver)
    if args.c2c is None:  # this tree's build of the probe, the host build's first
        build = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build")
        built = sorted(glob.glob(os.path.join(build, "*", "benchmarks", "core-to-core")),
                       key=lambda p: "/host/" not in p)
        args.c2c = os.environ.get("SMDDP_CORE_TO_CORE", built[0] if built else "")
    if args.settle is None:  # --from-csv cannot know what the runs did: the report then says nothing
        args.settle = 0.0 if args.from_csv else 0.5
    if args.from_csv:
        rounds_csv = os.path.join(args.out, "results_rounds.csv")
        write_outputs(read_rows(os.path.join(args.out, "results.csv")), args,
                      read_rows(rounds_csv) if os.path.exists(rounds_csv) else None)
        return
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
