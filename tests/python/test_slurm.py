"""Jobs started the way Slurm users start them, by Slurm's own daemons (#10): munged, slurmctld
and one slurmd per network-namespace host, started and torn down by tests/slurm/cluster.sh.
  - an `sbatch --nodes=2` job in seed 000's style: srun starts one torchrun per node, the
    rendezvous on the allocation's first node;
  - `srun --nodes=2 --ntasks-per-node=2` starting the ranks directly, no torchrun variables.
Each rank checks smddp against gloo in the same job (tests/python/workers/two_hosts_train.py), and
smddp must have seen two nodes. Nothing may stay behind: daemons, namespaces, shm segments."""
import glob
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import REPO, WORKERS, child_env

CLUSTER = os.path.join(REPO, "tests", "slurm", "cluster.sh")
pytestmark = [
    pytest.mark.one_torch,  # see conftest.py
    pytest.mark.skipif(os.geteuid() != 0, reason="Slurm's daemons and network namespaces need root"),
    pytest.mark.skipif(not all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged", "ip")),
                       reason="Slurm (slurmctld, slurmd, munge) or iproute2 is not installed (the trixie devenv has them)"),
]


DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")


def daemon_pids():
    """Live (not zombie) processes of Slurm's and munge's daemons."""
    ps = subprocess.run(["ps", "-eo", "pid=,stat=,comm="], capture_output=True, text=True).stdout
    return {int(f[0]) for f in (line.split() for line in ps.splitlines())
            if len(f) == 3 and f[2] in DAEMONS and not f[1].startswith("Z")}


def run_on_cluster(tmp_path, command, timeout=420):  # cluster.sh gives the command 300 s
    env = child_env({"SMDDP_SLURM_WORKER": os.path.join(WORKERS, "two_hosts_train.py"), "SMDDP_DEBUG": "INFO"})
    daemons_before = daemon_pids()
    p = subprocess.run([CLUSTER, str(tmp_path / "cluster"), "--", "bash", "-c", command], capture_output=True,
                       text=True, timeout=timeout, env=env, cwd=tmp_path)
    out = p.stdout + p.stderr
    # Nothing left behind: the daemons and job steps, the hosts (namespaces, their /etc/netns
    # files); conftest.py checks our shm segments after every test.
    for _ in range(50):
        left = daemon_pids() - daemons_before
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"daemons left running: {sorted(left)}"
    m = re.search(r"slurm-cluster: smddp-([0-9a-f]+)-h0", out)
    assert m, "the cluster did not come up:\n" + out[-8000:]
    hosts = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"smddp-{m.group(1)}-" not in hosts, hosts
    assert not glob.glob(f"/etc/netns/smddp-{m.group(1)}-*"), "hosts files left in /etc/netns"
    return p, out


def assert_ranks_ok(text, world=4):
    for r in range(world):
        assert f"rank {r} ALL OK" in text, text[-8000:]
    assert "topology: 2 nodes" in text, "smddp did not see two nodes:\n" + text[-8000:]


def test_sbatch_two_nodes_torchrun_per_node_like_seed_000(smddp_built, tmp_path):
    job = os.path.join(REPO, "tests", "slurm", "torchrun.sbatch")
    p, out = run_on_cluster(tmp_path, f"sbatch --wait --no-requeue {job}; rc=$?; cat smddp-torchrun-*.out; exit $rc")
    assert p.returncode == 0, out[-8000:]
    assert_ranks_ok(out)


def test_a_batch_script_is_no_rank_and_a_step_is_its_own_world(smddp_built, tmp_path):
    """`import smddp` in the batch script itself (no srun) fills nothing, so torch names RANK at
    once instead of rank 0 waiting for the allocation's other tasks; `srun -E` on part of the
    allocation (the allocation's SLURM_NTASKS kept) is a world of the step's tasks; a WORLD_SIZE
    exported for the allocation is kept and reported. The batch script of a one-task allocation
    (sbatch -n1) is that task: a world of one on this host."""
    show = "python3 -c 'import smddp, os; print(\"%s\", *(os.environ.get(k) for k in (\"RANK\", \"WORLD_SIZE\")))'"
    (tmp_path / "job.sh").write_text("\n".join([
        "#!/bin/bash", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --output=job.out", "set -e",
        show % "batch:", "srun -E -N1 -n2 " + show % "step:", "WORLD_SIZE=4 srun -N1 -n2 python3 -c 'import smddp'", ""]))
    (tmp_path / "one.sh").write_text("\n".join([
        "#!/bin/bash", "#SBATCH --ntasks=1", "#SBATCH --output=one.out",
        "python3 -c 'import smddp, os; print(\"one:\", *(os.environ.get(k) for k in (\"RANK\", \"WORLD_SIZE\", \"MASTER_ADDR\")))'",
        ""]))
    p, out = run_on_cluster(tmp_path, "sbatch --wait job.sh && sbatch --wait one.sh; rc=$?; cat job.out one.out; exit $rc")
    assert p.returncode == 0, out[-8000:]
    assert "batch: None None" in out, out[-8000:]
    assert sorted(line for line in out.splitlines() if line.startswith("step:")) == ["step: 0 2", "step: 1 2"], out[-8000:]
    assert out.count("smddp: WORLD_SIZE=4 is set, but the launcher says 2") == 2, out[-8000:]
    assert "one: 0 1 127.0.0.1" in out, out[-8000:]


def test_srun_starts_the_ranks_directly_without_torchrun(smddp_built, tmp_path):
    p, out = run_on_cluster(tmp_path, f"srun --nodes=2 --ntasks-per-node=2 python3 {WORKERS}/two_hosts_train.py srun")
    assert p.returncode == 0, out[-8000:]
    assert_ranks_ok(out)
