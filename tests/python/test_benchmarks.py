"""Smoke of the torch benchmark: a few sizes through smddp and gloo (and mpi where torch has it),
every result checked, every output file written. Never asserts a timing."""
import csv
import os
import re

import pytest
import shutil
import subprocess
import sys

import torch.distributed as dist

from conftest import REPO, child_env, smddp_build_dir

pytestmark = pytest.mark.one_torch  # see conftest.py


def test_torch_collectives_smoke(smddp_built, tmp_path):
    backends = "smddp,gloo" + (",mpi" if dist.is_mpi_available() and shutil.which("mpirun") else "")
    out = tmp_path / "bench"
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "torch_collectives.py"), "--np", "2",
                        "--backends", backends, "--ops", "allreduce,allgather,reduce_scatter", "--min", "8",
                        "--max", "64K", "--factor", "64", "--iters", "3", "--memcpy", "--rounds", "2",
                        "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=child_env(), cwd=REPO)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    for f in ("results.csv", "results.md"):
        assert (out / f).stat().st_size > 0
    rows = (out / "results.csv").read_text().splitlines()
    assert any(r.startswith("smddp,allreduce") for r in rows), rows[:5]
    assert all(r.split(",")[7] == "0" for r in rows[1:]), "a result had wrong elements"
    # --rounds 2: one row per point, the median of the two runs
    points = [tuple(r.split(",")[:4]) for r in rows[1:]]
    assert len(points) == len(set(points)), "a point appears once per round instead of once"
    try:
        import matplotlib  # noqa: F401
        assert (out / "allreduce_np2.png").stat().st_size > 0
    except ImportError:
        pass


def test_torch_collectives_offset_smoke(smddp_built, tmp_path):
    """--offset: every collective on views off torch's 64-byte alignment (FSDP shards, slices);
    every result checked."""
    out = tmp_path / "bench"
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "torch_collectives.py"), "--np", "2",
                        "--backends", "smddp,gloo", "--ops", "allreduce,allgather,reduce_scatter,broadcast",
                        "--min", "1K", "--max", "1M", "--factor", "32", "--iters", "3", "--offset", "3",
                        "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=child_env(), cwd=REPO)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["op"] for r in rows if r["backend"] == "smddp"} == {"allreduce", "allgather", "reduce_scatter", "broadcast"}
    assert all(r["wrong"] == "0" for r in rows), rows
    assert "view 3 float32 elements (12 bytes) into its buffer" in (out / "results.md").read_text()


def test_row_time_sets_each_points_iterations(smddp_built, tmp_path):
    """--row-time: a point's timed iterations follow from its warm-up's pace, 3 to --max-iters, and
    are the same on every rank (a rank looping another count would hang the run or fail it). What
    can be checked without a timing are the bounds: a row time no loop fills gives --max-iters,
    one that any single iteration exceeds gives 3, for the memcpy ceiling's rows too; the CSV and
    the report say so. Every run first settles (--settle: small allreduces until the slowest rank's
    clock says so, the same count on every rank, or the run would hang), and the report says so."""
    for row_time, want in (("1000", 7), ("1e-9", 3)):
        out = tmp_path / f"bench{want}"
        p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "torch_collectives.py"), "--np", "2",
                            "--backends", "smddp,gloo", "--ops", "allreduce,allgather", "--min", "8", "--max", "64K",
                            "--factor", "8192", "--iters", "200", "--row-time", row_time, "--max-iters", "7",
                            "--rounds", "2", "--memcpy", "--settle", "0.3", "--out", str(out)],
                           capture_output=True, text=True, timeout=600, env=child_env(), cwd=REPO)
        assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
        for name in ("results.csv", "results_rounds.csv"):
            with open(out / name) as f:
                rows = list(csv.DictReader(f))
            # (backends x ops + memcpy) x sizes, per round in results_rounds.csv
            assert len(rows) == (2 * 2 + 1) * 2 * (2 if name == "results_rounds.csv" else 1), rows
            assert all(r["wrong"] == "0" and r["iters"] == str(want) for r in rows), (row_time, rows)
        md = (out / "results.md").read_text()
        assert "iterations as fill" in md and "Every run first did 0.3 s of 8-byte allreduces" in md


def test_torch_collectives_compute_smoke(smddp_built, tmp_path):
    """--compute: a parallel ATen operation before every timed collective (#18), torch's pool
    left at its default (unset); every result checked, CPU time left out, the tables say so."""
    out = tmp_path / "bench"
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "torch_collectives.py"), "--np", "2",
                        "--backends", "smddp,gloo", "--ops", "allreduce", "--min", "8", "--max", "64K",
                        "--factor", "128", "--iters", "3", "--compute", "64K", "--contention", "unset",
                        "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=child_env(), cwd=REPO)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["backend"], r["bytes"]) for r in rows} == {(b, n) for b in ("smddp", "gloo") for n in ("8", "1024", "65536")}
    # the whole iteration holds the collective
    assert all(r["wrong"] == "0" and 0 < float(r["time_us"]) < float(r["iter_us"]) and r["cpu_us"] == "nan"
               for r in rows), rows
    md = (out / "results.md").read_text()
    assert "multiplied a tensor of 64K float32 elements" in md and "smddp iteration µs" in md


def hog_processes():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"while True: pass" in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_contention_modes_smoke(smddp_built, tmp_path):
    """--contention runs each backend three ways (#18); every mode gets its table and its rows carry
    the CPU time spent, and the busy processes of the hog mode are gone afterwards. --paired with
    --rounds 2: each backend runs its modes back to back, every round's rows are kept, and the
    report adds the per-round ratios (what targets.py reads for #18)."""
    out = tmp_path / "bench"
    modes = ("1", "unset", "hog")
    probe = os.path.join(os.path.dirname(smddp_build_dir()), "benchmarks", "core-to-core")
    assert os.access(probe, os.X_OK), f"{probe}: the core-to-core probe is built with the benchmarks"
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "torch_collectives.py"), "--np", "2",
                        "--backends", "smddp,gloo", "--ops", "allreduce", "--min", "8", "--max", "4K",
                        "--factor", "512", "--iters", "3", "--contention", ",".join(modes), "--paired",
                        "--rounds", "2", "--out", str(out), "--c2c", probe],
                       capture_output=True, text=True, timeout=600, env=child_env(), cwd=REPO)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["backend"], r["mode"]) for r in rows} == {(b, m) for b in ("smddp", "gloo") for m in modes}
    assert all(r["wrong"] == "0" and float(r["cpu_us"]) > 0 for r in rows), rows
    assert len(rows) == 2 * 3 * 2, "one median row per backend, mode and size"
    with open(out / "results_rounds.csv") as f:
        per_round = list(csv.DictReader(f))
    assert sorted((r["round"], r["backend"], r["mode"], r["bytes"]) for r in per_round) == sorted(
        (str(k), b, m, n) for k in (0, 1) for b in ("smddp", "gloo") for m in modes for n in ("8", "4096"))
    # Rank 0 read the probe before and after every row (the host may move the vCPUs meanwhile).
    assert all(float(r[k]) > 0 for r in per_round for k in ("c2c_before_ns", "c2c_after_ns")), per_round
    # The order the runs started in: round 0 smddp's three modes, then gloo's; round 1 the
    # backends reversed and the modes rotated by one.
    started = [line for line in p.stdout.splitlines() if line.startswith("== ")]
    title = {"1": "=1)", "unset": " unset)", "hog": "=1, one busy"}
    want = [(b, m) for b in ("smddp", "gloo") for m in modes]
    want += [(b, m) for b in ("gloo", "smddp") for m in modes[1:] + modes[:1]]
    assert len(started) == len(want), started
    for line, (b, m) in zip(started, want):
        assert line.startswith(f"== {b} (OMP_NUM_THREADS{title[m]}"), (line, b, m)
    md = (out / "results.md").read_text()
    for title in ("OMP_NUM_THREADS=1 (", "OMP_NUM_THREADS unset (", "OMP_NUM_THREADS=1, one busy process per core",
                  "paired within each round (median over 2 rounds", "| smddp unset/=1 |", "| gloo/smddp, hog |"):
        assert title in md, md[:3000]
    # The probe's readings per backend and mode: 2 rounds x 2 sizes, before and after each row.
    for b in ("smddp", "gloo"):
        for m in modes:
            assert re.search(rf"\| {b} \| {m} \| [0-8] of 8 \| [0-9]+–[0-9]+ \|", md), md[-2000:]
    assert not hog_processes(), "the hog mode left busy processes behind"


def training_step_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("training_step", os.path.join(REPO, "benchmarks", "training_step.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_step_rows_check_the_trained_parameters(smddp_built, tmp_path):
    """--ops ddp_step,fsdp_step: every rank trains on its own batch, and #wrong counts the parameter
    elements that differ from the model trained alone on all ranks' batches (0 for both backends).
    The check can fail: a replica that skipped the averaging (trained on its own batch alone) is
    far from that reference."""
    bench = training_step_module()
    width, steps = 16, bench.STEP_WARMUP + bench.STEP_TIMED
    reference = bench.step_reference(width, 2, steps)
    assert bench.mismatched(reference, bench.step_reference(width, 2, steps)) == 0
    alone = bench.step_reference(width, 1, steps)  # rank 0's batch only: no averaging
    assert bench.mismatched(alone, reference) > sum(p.numel() for p in reference) // 2
    assert bench.mismatched(reference[:-1], reference) == reference[-1].numel()

    out = tmp_path / "bench"
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "torch_collectives.py"), "--np", "2",
                        "--backends", "smddp,gloo", "--ops", "ddp_step,fsdp_step", "--step-width", str(width),
                        "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=child_env(), cwd=REPO)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["backend"], r["op"]) for r in rows} == {(b, o) for b in ("smddp", "gloo")
                                                       for o in ("ddp_step", "fsdp_step")}, rows
    assert all(r["wrong"] == "0" and not r["error"] and float(r["time_us"]) > 0 for r in rows), rows
    assert "## ddp_step" in (out / "results.md").read_text()
