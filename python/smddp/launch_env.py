"""The variables torch's env:// rendezvous needs, filled from the launcher that started the rank.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Jobs
started by `mpirun`, `srun` or SageMaker's MPI launcher get their own launcher's variables
instead, and `init_process_group(backend="smddp")` would fail on the first missing one. On
`import smddp` each missing variable is filled from the launcher that started this process:

    Open MPI   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
    PMI        PMI_RANK, PMI_SIZE (MPICH, Intel MPI), MPI_LOCALRANKID, MPI_LOCALNRANKS
    Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (srun steps)

in that order of preference (mpirun inside a Slurm allocation sees both; its own numbering is
the one the ranks follow). A variable the user or launcher set is never changed.

MASTER_ADDR: the local host when every rank is on this node; otherwise the first host of
SageMaker's SM_HOSTS, else the first host of the Slurm allocation (SLURM_JOB_NODELIST); left
unset when neither is known (torch then names the variable to set). MASTER_PORT: derived from
the job's id (SLURM_JOB_ID, Open MPI's PMIX_NAMESPACE, SageMaker's job name) so two jobs
sharing a node do not collide; 29500 (torch's default) when there is no id.

SMDATAPARALLEL_LOCAL_RANK (read by transformers' Trainer on SageMaker's data-parallel path) is
set from LOCAL_RANK. What was filled is printed to stderr when SMDDP_DEBUG is INFO or more.
"""
import json
import os
import re
import sys
import zlib

# (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) per launcher, most specific first.
_LAUNCHERS = [
    ("Open MPI", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("PMI", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
    ("Slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")),
]
_TORCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
DEFAULT_PORT = 29500


def expand_first_host(nodelist):
    """First host of a Slurm hostlist: 'gpu[03-05,9],cpu1' -> 'gpu03' (zero padding kept)."""
    nodelist = nodelist.strip()
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        return None
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _slurm_tasks_per_node(env):
    """Where SLURM_NTASKS_PER_NODE is absent: this node's entry of SLURM_TASKS_PER_NODE,
    '2(x3),1' (nodes 0-2 run 2 tasks, node 3 one), by SLURM_NODEID (the first where unknown)."""
    counts = []
    for part in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts += [m.group(1)] * int(m.group(2) or 1)
    try:
        node = int(env.get("SLURM_NODEID", "0"))
    except ValueError:
        node = 0
    return counts[node] if 0 <= node < len(counts) else (counts[0] if counts else None)


def _job_port(env):
    for key in ("SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "SAGEMAKER_JOB_NAME", "TRAINING_JOB_NAME"):
        if env.get(key):
            # Stable across processes (Python's hash() is salted per process), away from the
            # ephemeral range and from torch's default.
            return str(20000 + zlib.crc32(f"{key}={env[key]}".encode()) % 10000), key
    return str(DEFAULT_PORT), None


def fill(env=None):
    """Fills the missing rendezvous variables in `env` (default os.environ).

    Returns [(name, value, why)] for what it set; sets nothing outside a recognised launcher
    except SMDATAPARALLEL_LOCAL_RANK when LOCAL_RANK is known.
    """
    env = os.environ if env is None else env
    done = []

    def put(name, value, why):
        if value is None or name in env:
            return
        env[name] = str(value)
        done.append((name, str(value), why))

    launcher = next(((n, keys) for n, keys in _LAUNCHERS if env.get(keys[0]) and env.get(keys[1])), None)
    if launcher:
        name, keys = launcher
        values = [env.get(k) for k in keys]
        if name == "Slurm" and not values[3]:
            values[3] = _slurm_tasks_per_node(env)
        for t, k, v in zip(_TORCH, keys, values):
            put(t, v, f"{name} {k}")

    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" not in env:
        world, local = env.get("WORLD_SIZE"), env.get("LOCAL_WORLD_SIZE")
        hosts = None
        try:
            hosts = json.loads(env["SM_HOSTS"]) if env.get("SM_HOSTS") else None
        except ValueError:
            hosts = None
        if world and local and world == local:
            put("MASTER_ADDR", "127.0.0.1", "every rank on this node")
        elif hosts:
            put("MASTER_ADDR", hosts[0], "first host of SM_HOSTS")
        elif env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"):
            first = expand_first_host(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"))
            put("MASTER_ADDR", first, "first host of SLURM_JOB_NODELIST")
        elif world == "1":
            put("MASTER_ADDR", "127.0.0.1", "a single rank")
        elif launcher:
            print(f"smddp: RANK and WORLD_SIZE come from {launcher[0]}, but the ranks span nodes and no "
                  "launcher variable names the host of rank 0 (SM_HOSTS, SLURM_JOB_NODELIST): set MASTER_ADDR "
                  "(and MASTER_PORT) to it before init_process_group", file=sys.stderr)
    if "MASTER_ADDR" in env and "MASTER_PORT" not in env and launcher:
        port, key = _job_port(env)
        put("MASTER_PORT", port, key if key else "torch's default")
    if "LOCAL_RANK" in env:
        put("SMDATAPARALLEL_LOCAL_RANK", env["LOCAL_RANK"], "LOCAL_RANK")
    return done


def fill_and_log():
    done = fill()
    if done and os.environ.get("SMDDP_DEBUG", "").upper() in ("INFO", "TRACE"):
        for name, value, why in done:
            print(f"smddp: {name}={value} (from {why})", file=sys.stderr)
    return done
