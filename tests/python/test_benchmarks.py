"""Smoke of the torch benchmark: a few sizes through smddp and gloo (and mpi where torch has it),
every result checked, every output file written. Never asserts a timing."""
import os
import shutil
import subprocess
import sys

import torch.distributed as dist

from conftest import REPO, child_env


def test_torch_collectives_smoke(smddp_built, tmp_path):
    backends = "smddp,gloo" + (",mpi" if dist.is_mpi_available() and shutil.which("mpirun") else "")
    out = tmp_path / "bench"
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "torch_collectives.py"), "--np", "2",
                        "--backends", backends, "--ops", "allreduce,allgather,reduce_scatter", "--min", "8",
                        "--max", "64K", "--factor", "64", "--iters", "3", "--memcpy", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=child_env(), cwd=REPO)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    for f in ("results.csv", "results.md"):
        assert (out / f).stat().st_size > 0
    rows = (out / "results.csv").read_text().splitlines()
    assert any(r.startswith("smddp,allreduce") for r in rows), rows[:5]
    assert all(r.split(",")[7] == "0" for r in rows[1:]), "a result had wrong elements"
    try:
        import matplotlib  # noqa: F401
        assert (out / "allreduce_np2.png").stat().st_size > 0
    except ImportError:
        pass
