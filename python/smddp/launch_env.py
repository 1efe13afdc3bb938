"""The variables torch's env:// rendezvous needs, filled from the launcher that started the rank.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Jobs
started by `mpirun`, `srun` or SageMaker's MPI launcher get their own launcher's variables
instead, and `init_process_group(backend="smddp")` would fail on the first missing one. On
`import smddp` each missing variable is filled from the launcher that started this process:

    Open MPI   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
    PMI        PMI_RANK, PMI_SIZE (MPICH, Intel MPI), MPI_LOCALRANKID, MPI_LOCALNRANKS
    Slurm      SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, and this node's count of the
               step's tasks (SLURM_STEP_TASKS_PER_NODE by SLURM_NODEID, else
               SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE, which is only the requested most)

Slurm's world is the step's, which only srun sets (SLURM_STEP_NUM_TASKS): SLURM_NTASKS is the
allocation's in a batch script (itself task 0 of its allocation, with SLURM_PROCID=0) and under
`srun -E` (--preserve-env), so a script run by sbatch without srun, or a step on part of the
allocation, would wait for ranks that never start. A batch script is no launcher here (torch
then fails at once naming RANK), but for one of a one-task allocation (SLURM_NTASKS=1), which is
that task: a world of one.

in that order of preference (mpirun inside a Slurm allocation sees both; its own numbering is
the one the ranks follow). Where the chosen launcher has no local rank or count (srun with
Slurm's pmi2 plugin sets PMI_RANK and PMI_SIZE only), Slurm's are taken if its rank and size
are the chosen ones. A variable the user or launcher set is never changed; where one of the four
differs from what the chosen launcher says (a WORLD_SIZE exported for the whole allocation before
`srun -n` on part of it), both are printed to stderr (not where RANK or LOCAL_RANK differ too: a
launcher inside the task, torchrun's or DeepSpeed's, started this process). A process that starts ranks of its own (mp.spawn) hands its
children what it filled: they must pass their rank and world size to init_process_group.

MASTER_ADDR: the local host when every rank is on this node; otherwise the first host of
SageMaker's SM_HOSTS, else the first host of the Slurm step (SLURM_STEP_NODELIST), else of the
allocation (SLURM_JOB_NODELIST); left unset when none is known (torch then names the variable to
set). MASTER_PORT: derived from the id of what started the ranks (Open MPI's PMIX_NAMESPACE for
mpirun, even inside Slurm; SLURM_JOB_ID with the step's SLURM_STEP_ID for srun; SageMaker's job
name) so two jobs, or two steps or mpiruns of one allocation, sharing a node do not collide;
29500 (torch's default) when there is no id.

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
    ("Slurm", ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")),
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
    """This node's entry of the step's SLURM_STEP_TASKS_PER_NODE (srun), else of the
    allocation's SLURM_TASKS_PER_NODE: '2(x3),1' (nodes 0-2 run 2 tasks, node 3 one), by
    SLURM_NODEID (the first where unknown). None when neither is there or readable."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return None
    counts = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts += [m.group(1)] * int(m.group(2) or 1)
    try:
        node = int(env.get("SLURM_NODEID", "0"))
    except ValueError:
        node = 0
    return counts[node] if 0 <= node < len(counts) else (counts[0] if counts else None)


def _job_port(env, launcher):
    """A port every rank of this job derives alike: from the id of what started the ranks."""
    keys = ["SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "SAGEMAKER_JOB_NAME", "TRAINING_JOB_NAME"]
    if launcher == "Open MPI":  # mpirun inside a Slurm allocation: its own job, not the allocation
        keys.remove("SLURM_JOB_ID")
        keys.insert(2, "SLURM_JOB_ID")
    for key in keys:
        if env.get(key):
            value = env[key]
            if key == "SLURM_JOB_ID" and env.get("SLURM_STEP_ID"):  # two steps of one allocation
                value += "." + env["SLURM_STEP_ID"]
            # Stable across processes (Python's hash() is salted per process), away from the
            # ephemeral range and from torch's default.
            return str(20000 + zlib.crc32(f"{key}={value}".encode()) % 10000), key
    return str(DEFAULT_PORT), None


def _launcher(env):
    """(launcher name, its RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE values, where each came
    from), or None outside a recognised launcher."""
    def get(key):
        if key == "SLURM_STEP_NUM_TASKS" and not env.get(key) and env.get("SLURM_NTASKS") == "1":
            return "1"  # the batch script of a one-task allocation is its task
        return env.get(key)
    launcher = next(((n, keys) for n, keys in _LAUNCHERS if get(keys[0]) and get(keys[1])), None)
    if not launcher:
        return None
    name, keys = launcher
    values = [get(k) for k in keys]
    whys = [f"{name} {k}" for k in keys]
    if name == "Slurm" and not env.get(keys[1]):
        whys[1] = "Slurm SLURM_NTASKS (a one-task batch script)"
    if name == "Slurm":
        per_node = _slurm_tasks_per_node(env)
        if per_node:
            values[3], whys[3] = per_node, "Slurm's tasks on this node"
    elif (not values[2] or not values[3]) and (env.get("SLURM_PROCID"), get("SLURM_STEP_NUM_TASKS")) == tuple(
            values[:2]):
        # The same ranks as Slurm's (srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE only): its
        # local numbering is theirs.
        slurm_local = (env.get("SLURM_LOCALID"), _slurm_tasks_per_node(env) or env.get("SLURM_NTASKS_PER_NODE"))
        for i in (2, 3):
            if not values[i] and slurm_local[i - 2]:
                values[i], whys[i] = slurm_local[i - 2], f"Slurm's, as {name}'s ranks are Slurm's"
    return name, values, whys


def disagreements(env=None):
    """[(name, value set, launcher's value, where that came from)] for WORLD_SIZE and
    LOCAL_WORLD_SIZE where they are set and differ from the launcher's while this process is the
    launcher's task. A RANK or LOCAL_RANK that differs says it is not: another launcher started it
    inside the task (torchrun, DeepSpeed's, a script's own), and nothing is compared then."""
    env = os.environ if env is None else env
    found = _launcher(env)
    if not found or env.get("TORCHELASTIC_RUN_ID"):
        return []
    ours = dict(zip(_TORCH, zip(found[1], found[2])))
    for t in ("RANK", "LOCAL_RANK"):
        if t in env and ours[t][0] is not None and env[t] != str(ours[t][0]):
            return []
    return [(t, env[t], ours[t][0], ours[t][1]) for t in ("WORLD_SIZE", "LOCAL_WORLD_SIZE")
            if ours[t][0] is not None and t in env and env[t] != str(ours[t][0])]


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

    found = _launcher(env)
    launcher = found[0] if found else None
    if found:
        for t, v, why in zip(_TORCH, found[1], found[2]):
            put(t, v, why)

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
        elif env.get("SLURM_STEP_NODELIST") and launcher and launcher != "Open MPI":
            # srun: the step's first host runs its rank 0, which need not be the allocation's
            # first (a step on part of the allocation, -r, -w, concurrent steps).
            put("MASTER_ADDR", expand_first_host(env["SLURM_STEP_NODELIST"]), "first host of SLURM_STEP_NODELIST")
        elif env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"):
            first = expand_first_host(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"))
            put("MASTER_ADDR", first, "first host of SLURM_JOB_NODELIST")
        elif world == "1":
            put("MASTER_ADDR", "127.0.0.1", "a single rank")
        elif launcher:
            print(f"smddp: RANK and WORLD_SIZE come from {launcher}, but the ranks span nodes and no "
                  "launcher variable names the host of rank 0 (SM_HOSTS, SLURM_JOB_NODELIST): set MASTER_ADDR "
                  "(and MASTER_PORT) to it before init_process_group", file=sys.stderr)
    if "MASTER_ADDR" in env and "MASTER_PORT" not in env and launcher:
        port, key = _job_port(env, launcher)
        put("MASTER_PORT", port, key if key else "torch's default")
    if "LOCAL_RANK" in env:
        put("SMDATAPARALLEL_LOCAL_RANK", env["LOCAL_RANK"], "LOCAL_RANK")
    return done


def fill_and_log():
    for name, value, theirs, why in disagreements():
        print(f"smddp: {name}={value} is set, but the launcher says {theirs} ({why}); torch uses {name}={value}: "
              f"unset it if it was meant for another job or step", file=sys.stderr)
    done = fill()
    if done and os.environ.get("SMDDP_DEBUG", "").upper() in ("INFO", "TRACE"):
        for name, value, why in done:
            print(f"smddp: {name}={value} (from {why})", file=sys.stderr)
    return done


def local_rank_for_group(size, env):
    """The process's LOCAL_RANK (torchrun's, or filled from the launcher) for a subgroup's backend
    of `size` ranks, -1 where the communicator's own topology is to decide. It picks the NIC of the
    group's traffic between nodes: in a subgroup with one process per node (HSDP's replicate
    groups) each process's place among the group's ranks on its node is 0. The world's group
    knows its local ranks itself, and a LOCAL_RANK outside [0, LOCAL_WORLD_SIZE) is none."""
    try:
        if size == int(env.get("WORLD_SIZE", "")):
            return -1
    except ValueError:
        pass
    try:
        r = int(env.get("LOCAL_RANK", ""))
        n = int(env.get("LOCAL_WORLD_SIZE", str(r + 1)))
    except ValueError:
        return -1
    return r if 0 <= r < n else -1
