"""benchmarks/targets.py, the table of #12's and #18's targets that run_all.sh writes: its verdicts on
results whose ratios are known (written here), since a wrong verdict would misreport every run.
No timing is measured."""
import csv
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.one_torch  # plain Python: one suite is enough

FIELDS = ["backend", "op", "world", "bytes", "time_us", "algbw", "busbw", "wrong", "error", "mode", "cpu_us", "round"]


def write_csv(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({"wrong": 0, "error": "", "mode": "1", "cpu_us": 1.0, "algbw": 1.0, "busbw": 1.0, **r})


def row(backend, op, nbytes, time_us, **kw):
    return {"backend": backend, "op": op, "world": 2, "bytes": nbytes, "time_us": time_us, **kw}


def report(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "targets.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "targets.md").read_text() == out.stdout
    lines = {}
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("#"):
            lines[(cells[1], cells[2])] = cells
    return lines


def test_verdicts_on_known_ratios(tmp_path):
    big = 8 << 20
    write_csv(tmp_path / "torch_np2" / "results.csv", [
        # allreduce: 1.5x Open MPI at 8 B, 1.1x at 2 KiB (misses 1.2x); 10x gloo; at 8 MiB half the copy
        row("smddp", "allreduce", 8, 10.0), row("mpi", "allreduce", 8, 15.0), row("gloo", "allreduce", 8, 100.0),
        row("smddp", "allreduce", 2048, 10.0), row("mpi", "allreduce", 2048, 11.0),
        row("gloo", "allreduce", 2048, 100.0),
        row("smddp", "allreduce", big, 1000.0, busbw=4.0), row("mpi", "allreduce", big, 2000.0),
        row("gloo", "allreduce", big, 10000.0),
        row("memcpy", "limit", big, 100.0, world=1, algbw=8.0),
        # allgather: gloo gave wrong elements at 8 B, so that point is not counted
        row("smddp", "allgather", 8, 10.0), row("gloo", "allgather", 8, 20.0, wrong=3),
        row("smddp", "allgather", 2048, 10.0), row("gloo", "allgather", 2048, 60.0),
        # reduce_scatter: smddp failed at 2 KiB (NaN, an error): a miss, never a pass
        row("smddp", "reduce_scatter", 8, 10.0), row("gloo", "reduce_scatter", 8, 90.0),
        row("smddp", "reduce_scatter", 2048, float("nan"), error="timed out"),
        row("gloo", "reduce_scatter", 2048, 90.0),
        row("smddp", "ddp_step", 1, 90.0), row("gloo", "ddp_step", 1, 120.0), row("mpi", "ddp_step", 1, 100.0),
    ])
    with open(tmp_path / "netns_unshaped.md", "w") as f:
        f.write("iperf3 16.00 Gbit/s (2.000 GB/s) (same kind of link)\n"
                "iperf3 both ways at once, each way 10.00 Gbit/s (1.250 GB/s) (an allreduce sends both ways)\n"
                "      65536 B: 0.100 GB/s over the link\n"
                "    1048576 B: 1.000 GB/s over the link\n"
                "    4194304 B: 1.800 GB/s over the link\n"
                "# total #wrong: 0\n")
    write_csv(tmp_path / "contention_np2" / "results.csv", [
        row("smddp", "allreduce", 8, 10.0), row("smddp", "allreduce", 8, 13.0, mode="unset"),
        row("smddp", "allreduce", 8, 30.0, mode="hog"),
        row("mpi", "allreduce", 8, 12.0), row("mpi", "allreduce", 8, 12.0, mode="unset"),
        row("mpi", "allreduce", 8, 24.0, mode="hog"),
    ])
    t = report(tmp_path)
    where = "w=2, one node, torch"
    assert t[("allreduce vs Open MPI (time)", where)][4:] == ["worst 1.10x at 2 KiB; 1 of 3 points miss", "no"]
    assert t[("allreduce vs gloo (time)", where)][4:] == ["worst 10.00x at 8 B; 0 of 3 points miss", "yes"]
    assert t[("allreduce busbw / memcpy, ≥ 8 MiB", where)][4:] == ["worst 0.50 at 8 MiB", "no"]
    assert t[("allgather vs gloo (time)", where)][4:] == ["worst 6.00x at 2 KiB", "yes"]
    assert t[("reduce_scatter vs gloo (time)", where)][4:] == ["worst 9.00x at 8 B; 1 of 2 points miss (1 not measured)",
                                                               "no"]
    assert t[("DDP step, peers' best / smddp", where)][4:] == ["worst 1.11x", "yes"]
    assert t[("FSDP step, peers' best / smddp", where)][4:] == ["not measured", "n/a"]
    assert t[("reduce_scatter vs Open MPI (time)", "w=4, one node, torch")][5] == "n/a"  # no w=4 results
    link = t[("allreduce link rate / iperf3, ≥ 1 MiB", "2 namespace hosts, unshaped")]
    assert link[4:] == ["worst 50% at 1 MiB; 1 of 2 points miss", "no"]
    both = t[("allreduce link rate / iperf3 both ways, ≥ 1 MiB", "2 namespace hosts, unshaped")]
    assert both[4:] == ["worst 80% at 1 MiB; 0 of 2 points miss", "yes"]
    w2 = "w=2, allreduce, torch"
    assert t[("smddp OMP unset / OMP=1 (time)", w2)][4:] == ["worst 1.30x at 8 B", "no"]
    assert t[("OMP unset: Open MPI / smddp (time)", w2)][4:] == ["worst 0.92x at 8 B", "no"]
    assert t[("beside a busy core: smddp's slowdown / Open MPI's", w2)][4:] == ["worst 1.50x at 8 B", "no"]


def test_contention_ratios_pair_within_rounds(tmp_path):
    """With every round kept (results_rounds.csv), #18's ratios are taken within each round and the
    median over rounds is the figure: here the medians of separate runs would read 0.75x (a pass by
    accident) while the rounds' own ratios are 1.2, 1.1 and 0.5. A round where smddp failed is a miss."""
    rounds = [(10.0, 12.0, 12.0, 12.0), (20.0, 22.0, 20.0, 20.0), (30.0, 15.0, 40.0, 40.0)]
    rows = []
    for k, (s1, su, m1, mu) in enumerate(rounds):
        # Open MPI failed in round 1: that round says nothing of smddp against it
        rows += [row("smddp", "allreduce", 8, s1, round=k), row("smddp", "allreduce", 8, su, mode="unset", round=k),
                 row("mpi", "allreduce", 8, m1, round=k),
                 row("mpi", "allreduce", 8, float("nan") if k == 1 else mu, mode="unset", round=k,
                     error="mpirun failed" if k == 1 else "")]
        # 4 KiB: smddp unset failed in the last round
        rows += [row("smddp", "allreduce", 4096, 10.0, round=k),
                 row("smddp", "allreduce", 4096, float("nan") if k == 2 else 10.0, mode="unset", round=k,
                     error="timed out" if k == 2 else "")]
    write_csv(tmp_path / "contention_np2" / "results_rounds.csv", rows)
    t = report(tmp_path)
    w2 = "w=2, allreduce, torch"
    paired = " (median of per-round ratios)"
    assert t[("smddp OMP unset / OMP=1 (time)" + paired, w2)][4:] == [
        "worst 1.10x at 8 B; 1 of 2 points miss (1 not measured)", "no"]
    # Open MPI's unset over smddp's in the rounds where it ran: 1.0 and 2.67 -> 1.83
    assert t[("OMP unset: Open MPI / smddp (time)" + paired, w2)][4:] == ["worst 1.83x at 8 B", "yes"]


def test_contention_reads_the_dense_sweep_where_it_was_run(tmp_path):
    """#18 asks every size: where run_all.sh's dense sweep (contention_dense_np{2,4}) is there, its
    rows decide and say so in "where"; the six-size sweep beside it, here passing, is not read."""
    write_csv(tmp_path / "contention_np2" / "results.csv", [
        row("smddp", "allreduce", 8, 10.0), row("smddp", "allreduce", 8, 10.0, mode="unset")])
    write_csv(tmp_path / "contention_dense_np2" / "results.csv", [
        row("smddp", "allreduce", 8, 10.0), row("smddp", "allreduce", 8, 10.0, mode="unset"),
        row("smddp", "allreduce", 2 << 20, 100.0), row("smddp", "allreduce", 2 << 20, 130.0, mode="unset")])
    t = report(tmp_path)
    assert ("smddp OMP unset / OMP=1 (time)", "w=2, allreduce, torch") not in t
    assert t[("smddp OMP unset / OMP=1 (time)", "w=2, allreduce, torch, every 4x")][4:] == [
        "worst 1.30x at 2 MiB; 1 of 2 points miss", "no"]
