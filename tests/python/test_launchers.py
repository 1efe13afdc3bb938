"""Ranks started the ways users start them other than torchrun (#10): the rendezvous variables
filled from the launcher's own (smddp.launch_env), and a job under Open MPI's real mpirun running
a script written for SageMaker's SMDDP API before 1.4, checked against gloo; on two
network-namespace hosts, seed 002's SageMaker launcher (torch.distributed.run per host from
SM_HOSTS/SM_CURRENT_HOST) and mpirun across the hosts as SageMaker's MPI path runs it."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import WORKERS, REPO, NamespaceHosts, launcher_env, needs_hosts, package_module

pytestmark = pytest.mark.one_torch  # see conftest.py


def _launch_env():
    return package_module("launch_env")


def fill(env):
    env = dict(env)
    _launch_env().fill(env)
    return env


OMPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PMIX_NAMESPACE": "prterun-h1-4242@1"}
# A task of `srun -n4` (srun sets SLURM_STEP_NUM_TASKS; SLURM_NTASKS is the allocation's).
SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1",
         "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "trn[007-008]", "SLURM_JOB_ID": "1234"}


@pytest.mark.parametrize("size,env,want", [
    (2, {"WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, 3),   # HSDP's replicate group
    (8, {"WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, -1),  # the world's: its topology
    (2, {"WORLD_SIZE": "8", "LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4"}, -1),  # no local rank of 4 ranks
    (2, {"WORLD_SIZE": "8", "LOCAL_RANK": "-1"}, -1),
    (2, {"WORLD_SIZE": "8", "LOCAL_RANK": "2"}, 2),                            # LOCAL_WORLD_SIZE unknown
    (2, {"WORLD_SIZE": "8"}, -1),
    (2, {"LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "4"}, -1),
])
def test_a_subgroup_takes_the_nic_of_the_process_local_rank(size, env, want):
    assert _launch_env().local_rank_for_group(size, env) == want


def test_open_mpi_across_nodes_on_sagemaker():
    e = fill(dict(OMPI, SM_HOSTS='["algo-1", "algo-2"]', SM_CURRENT_HOST="algo-2"))
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == ("5", "8", "1", "4")
    assert e["MASTER_ADDR"] == "algo-1"  # SageMaker's launcher uses SM_HOSTS[0] as the master too
    assert e["SMDATAPARALLEL_LOCAL_RANK"] == "1"
    port = int(e["MASTER_PORT"])
    assert 20000 <= port < 30000 and port != 29500
    # Every rank of the job derives the same port; another job (namespace) most likely another.
    assert fill(dict(OMPI, OMPI_COMM_WORLD_RANK="0", SM_HOSTS='["algo-1", "algo-2"]'))["MASTER_PORT"] == e["MASTER_PORT"]
    assert fill(dict(OMPI, PMIX_NAMESPACE="prterun-h1-4243@1", SM_HOSTS='["a"]'))["MASTER_PORT"] != e["MASTER_PORT"]


def test_slurm_step_takes_the_first_host_of_the_allocation():
    e = fill(SLURM)
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == ("3", "4", "1", "2")
    assert e["MASTER_ADDR"] == "trn007"
    assert e["MASTER_PORT"] == fill(dict(SLURM, SLURM_PROCID="0"))["MASTER_PORT"]


@pytest.mark.parametrize("per_node,node,want", [("3,2", "0", "3"), ("3,2", "1", "2"), ("2(x3),1", "2", "2"),
                                                ("2(x3),1", "3", "1"), ("4", None, "4"), ("bad", "0", None)])
def test_slurm_uneven_steps_take_this_nodes_count(per_node, node, want):
    # srun -n5 -N2 runs 3 tasks on node 0 and 2 on node 1: each node's own count, not the first's
    env = dict(SLURM, SLURM_TASKS_PER_NODE=per_node)
    if node is not None:
        env["SLURM_NODEID"] = node
    assert fill(env).get("LOCAL_WORLD_SIZE") == want


def test_one_node_uses_the_local_host_and_pmi_is_read():
    e = fill({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["MASTER_ADDR"]) == ("1", "2", "1", "127.0.0.1")
    assert e["MASTER_PORT"] == "29500"  # no job id to derive one from: torch's default


def test_mpirun_inside_slurm_follows_mpirun():
    e = fill(dict(SLURM, **OMPI))
    assert (e["RANK"], e["WORLD_SIZE"]) == ("5", "8")


def test_mpirun_inside_slurm_takes_its_port_from_its_own_job():
    # Two mpiruns in one allocation (one node): each its own port, not the allocation's.
    a = fill(dict(SLURM, **dict(OMPI, OMPI_COMM_WORLD_SIZE="4")))
    b = fill(dict(SLURM, **dict(OMPI, OMPI_COMM_WORLD_SIZE="4", PMIX_NAMESPACE="prterun-h1-9999@1")))
    assert a["MASTER_ADDR"] == b["MASTER_ADDR"] == "127.0.0.1"
    assert a["MASTER_PORT"] != b["MASTER_PORT"]


# srun with Slurm's pmi2 plugin (--mpi=pmi2, or MpiDefault=pmi2) sets PMI_RANK and PMI_SIZE but no
# PMI local rank: the local numbering comes from Slurm, whose ranks these are.
def test_srun_with_pmi2_takes_the_local_rank_from_slurm():
    env = dict(SLURM, PMI_RANK="3", PMI_SIZE="4", SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_NODEID="1")
    e = fill(env)
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == ("3", "4", "1", "2")
    # mpiexec's own numbering (another rank than Slurm's) is not mixed with Slurm's.
    e = fill(dict(SLURM, PMI_RANK="0", PMI_SIZE="2"))
    assert "LOCAL_RANK" not in e


# A step is not its allocation: `srun -N2 -n3 --ntasks-per-node=2` runs one task on the second
# node (SLURM_NTASKS_PER_NODE is the requested most); `sbatch -N2 --ntasks-per-node=4` then
# `srun -n4` spreads 2 and 2, whose ranks meet on the step's first host, not on 127.0.0.1; a
# step on part of the allocation meets on its own first host; two steps take two ports.
def test_a_slurm_step_counts_its_own_tasks_and_hosts():
    step = dict(SLURM, SLURM_NTASKS="3", SLURM_STEP_NUM_TASKS="3", SLURM_PROCID="2", SLURM_LOCALID="0", SLURM_NTASKS_PER_NODE="2",
                SLURM_STEP_TASKS_PER_NODE="2,1", SLURM_NODEID="1", SLURM_STEP_ID="0")
    assert fill(step)["LOCAL_WORLD_SIZE"] == "1"
    spread = dict(SLURM, SLURM_NTASKS_PER_NODE="4", SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_NODEID="0",
                  SLURM_STEP_NODELIST="trn[007-008]", SLURM_STEP_ID="0")
    e = fill(spread)
    assert (e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"]) == ("2", "trn007")
    part = dict(SLURM, SLURM_JOB_NODELIST="trn[007-009]", SLURM_STEP_NODELIST="trn[008-009]", SLURM_STEP_ID="1")
    assert fill(part)["MASTER_ADDR"] == "trn008"
    assert fill(part)["MASTER_PORT"] != fill(dict(part, SLURM_STEP_ID="2"))["MASTER_PORT"]


# What Slurm 24.11 (trixie's, tests/slurm/cluster.sh) set in an `sbatch -N2 --ntasks-per-node=2`
# batch script and in `srun -E -N1 -n2` inside it: the batch script is task 0 of the allocation's
# 4, and -E keeps the allocation's SLURM_NTASKS. Taking those as the world, rank 0 waited for 3
# ranks that never start (found by review); test_slurm.py runs both under Slurm's daemons.
def test_a_batch_script_is_no_launcher_and_a_step_is_its_own_world():
    batch = {"SLURM_LOCALID": "0", "SLURM_NPROCS": "4", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2",
             "SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "trn[007-008]",
             "SLURM_JOB_ID": "1234"}
    e = fill(batch)
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR"} & set(e), e
    preserved = dict(batch, SLURM_PROCID="1", SLURM_LOCALID="1", SLURM_STEP_NUM_TASKS="2",
                     SLURM_STEP_TASKS_PER_NODE="2", SLURM_STEP_NODELIST="trn007", SLURM_STEP_ID="1")
    e = fill(preserved)
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == ("1", "2", "1", "2")
    assert e["MASTER_ADDR"] == "127.0.0.1"
    # The batch script of a one-task allocation (sbatch -n1) is that task: a world of one.
    e = fill(dict(batch, SLURM_NTASKS="1", SLURM_NPROCS="1", SLURM_TASKS_PER_NODE="1", SLURM_NTASKS_PER_NODE="1"))
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"]) == (
        "0", "1", "0", "1", "127.0.0.1")


def test_a_set_variable_the_launcher_contradicts_is_reported(smddp_built):
    launch_env = _launch_env()
    # WORLD_SIZE exported for the allocation, then `srun -n4` on part of it: kept, and reported.
    assert launch_env.disagreements(dict(SLURM, WORLD_SIZE="8")) == [
        ("WORLD_SIZE", "8", "4", "Slurm SLURM_STEP_NUM_TASKS")]
    assert launch_env.disagreements(dict(SLURM, WORLD_SIZE="4")) == []
    # torchrun's workers see the srun task that started torchrun: nothing to compare there; nor
    # where another launcher inside the task set a RANK of its own (DeepSpeed's sets no
    # TORCHELASTIC_RUN_ID).
    assert launch_env.disagreements(dict(SLURM, RANK="6", WORLD_SIZE="8", TORCHELASTIC_RUN_ID="x")) == []
    assert launch_env.disagreements(dict(SLURM, RANK="6", WORLD_SIZE="8", LOCAL_RANK="2")) == []
    assert launch_env.disagreements(dict(SLURM, RANK="3", WORLD_SIZE="8")) == [
        ("WORLD_SIZE", "8", "4", "Slurm SLURM_STEP_NUM_TASKS")]
    p = subprocess.run([sys.executable, "-c", "import smddp, os; print(os.environ['WORLD_SIZE'])"],
                       capture_output=True, text=True, env=dict(launcher_env(SLURM), WORLD_SIZE="8"), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["8"]
    assert "smddp: WORLD_SIZE=8 is set, but the launcher says 4 (Slurm SLURM_STEP_NUM_TASKS)" in p.stderr


def test_nothing_the_user_set_is_changed():
    mine = {"RANK": "7", "WORLD_SIZE": "9", "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "1111", "LOCAL_RANK": "3"}
    e = fill(dict(OMPI, **mine))
    for k, v in mine.items():
        assert e[k] == v
    assert e["LOCAL_WORLD_SIZE"] == "4"  # what was missing is still filled


def test_outside_a_launcher_nothing_is_invented():
    assert fill({"HOME": "/root"}) == {"HOME": "/root"}


def test_unknown_rendezvous_host_names_the_variable(smddp_built):
    env = launcher_env(OMPI)
    p = subprocess.run([sys.executable, "-c", "import smddp, os; print(os.environ.get('RANK'), 'MASTER_ADDR' in os.environ)"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["5", "False"]
    assert "set MASTER_ADDR" in p.stderr


def test_info_log_says_what_was_filled(smddp_built):
    env = launcher_env(dict(SLURM, SMDDP_DEBUG="INFO"))
    p = subprocess.run([sys.executable, "-c", "import smddp"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "smddp: RANK=3 (from Slurm SLURM_PROCID)" in p.stderr
    assert "smddp: MASTER_ADDR=trn007 (from first host of SLURM_JOB_NODELIST)" in p.stderr


@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI's mpirun is not installed (the trixie devenv has it)")
def test_mpirun_np4_runs_an_smddp_1_3_style_script(smddp_built):
    env = launcher_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    cmd = ["mpirun", "-np", "4", "--oversubscribe", "--bind-to", "none", sys.executable,
           os.path.join(WORKERS, "old_api_train.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    for r in range(4):
        assert f"rank {r} ALL OK" in p.stdout, out[-6000:]


# --- on two network-namespace hosts (tools/netns), started as SageMaker starts jobs ---
# Each host's name is its namespace's and resolves inside every host; what a site would set per
# host (SMDDP_NODE_ID: the pretend hosts share one kernel; the link for libfabric's tcp provider
# and gloo) is set as tests/launchers/netns_ssh sets it.
LAUNCHERS = os.path.join(REPO, "tests", "launchers")
def assert_two_hosts_ok(out, world=4):
    for r in range(world):
        assert f"rank {r} ALL OK" in out, out[-8000:]
    assert "topology: 2 nodes" in out, "smddp did not see two nodes:\n" + out[-8000:]


@needs_hosts
def test_seed_002_launcher_on_two_hosts_with_sagemakers_variables(smddp_built):
    hosts = NamespaceHosts(2)
    try:
        procs = []
        for i, name in enumerate(hosts.names):
            env = hosts.site_env(i, {"SM_HOSTS": json.dumps(hosts.names), "SM_CURRENT_HOST": name,
                                     "SM_NUM_GPUS": "2", "SAGEMAKER_JOB_NAME": f"smddp-test-{hosts.id}",
                                     "SMDDP_DEBUG": "INFO"})
            cmd = ["ip", "netns", "exec", name, sys.executable, os.path.join(LAUNCHERS, "sagemaker_launcher.py"),
                   os.path.join(WORKERS, "two_hosts_train.py"), "torchrun"]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                          cwd=REPO))
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=300)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
        out = "".join(outs)
        assert all(p.returncode == 0 for p in procs), out[-8000:]
        assert_two_hosts_ok(out)
    finally:
        hosts.close()


@needs_hosts
@pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI's mpirun is not installed (the trixie devenv has it)")
def test_mpirun_across_two_hosts_runs_an_smddp_1_3_style_script(smddp_built):
    # SageMaker's MPI path: one mpirun on the first host starts every rank, its daemons on the
    # other hosts over ssh (here tests/launchers/netns_ssh); MASTER_ADDR comes from SM_HOSTS.
    hosts = NamespaceHosts(2)
    try:
        h0, h1 = hosts.names
        env = hosts.site_env(0, {"SM_HOSTS": json.dumps(hosts.names), "SM_CURRENT_HOST": h0, "SMDDP_DEBUG": "INFO"})
        cmd = ["ip", "netns", "exec", h0, "mpirun", "--allow-run-as-root", "-np", "4", "-H", f"{h0}:2,{h1}:2",
               "--prtemca", "plm_ssh_agent", os.path.join(LAUNCHERS, "netns_ssh"), "--bind-to", "none",
               "-x", "PYTHONPATH", "-x", "SM_HOSTS", "-x", "SMDDP_DEBUG", "-x", "OMP_NUM_THREADS",
               sys.executable, os.path.join(WORKERS, "old_api_train.py")]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out[-8000:]
        assert_two_hosts_ok(out)
        assert f"MASTER_ADDR={h0} (from first host of SM_HOSTS)" in out, out[-8000:]
    finally:
        hosts.close()
