"""torch's intra-op threads when the launcher left OMP_NUM_THREADS unset (SMDDP_INTRA_OP_THREADS).

torch's OpenMP pool has a thread per core by default, and every rank of a node has one: with L
ranks per node the node runs L times as many threads as it has cores. After each parallel region
(any large ATen operation of the model) libgomp's threads spin for some milliseconds before they
sleep, on the very cores the next collective's ranks need. Measured on 2 cores, 2 ranks, fp32
allreduce after a 1M-element multiply (docs/performance.md, "When the cores are shared"): 8 B
took 16-70x its time with one thread, and Open MPI and gloo lose as much. torchrun sets
OMP_NUM_THREADS=1 for this reason; mpirun, srun and SageMaker's MPI launcher do not. By the time
`import smddp` runs libgomp has read its environment, so the pool is resized through torch
instead, when the world's backend is created:

    auto   (default) where OMP_NUM_THREADS is unset, LOCAL_RANK and LOCAL_WORLD_SIZE (torchrun's,
           or filled from the launcher by launch_env) say L > 1 ranks share the node, and torch
           has the thread count it had at `import smddp` (no torch.set_num_threads since): give
           each rank its share of the node's CPUs, min(its own CPUs, node CPUs // L), at least
           1, where torch has more
    keep   leave torch's threads as they are
    N      set N threads (N >= 1)

The node's CPUs are the union of its ranks' CPU affinities, which they exchange through the
store (a rank bound to its own cores, a socket shared by several, a container's or a Slurm job's
cpuset: the union is what the node's ranks share). Decided once per process, at the first
backend that spans the world. Local rank 0 says on stderr what was changed.
"""
import os
import sys
from datetime import timedelta

ENV = "SMDDP_INTRA_OP_THREADS"

_at_import = None
_decided = False


def remember():
    """Called at `import smddp`: torch's count then is the one nobody chose after it."""
    global _at_import
    import torch
    _at_import = torch.get_num_threads()


def cpu_list(cpus):
    """'0-3,8' for {0, 1, 2, 3, 8}."""
    runs = []  # [first, last] of each run of consecutive CPUs
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def parse_cpu_list(text):
    """{0, 1, 2, 3, 8} for '0-3,8'; set() for ''."""
    cpus = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def plan(setting, env, threads_now, threads_at_import, own_cpus, node_cpus):
    """(threads to set or None, why): what SMDDP_INTRA_OP_THREADS=setting asks of a rank whose
    torch has threads_now threads (threads_at_import at `import smddp`), whose affinity holds
    own_cpus CPUs, on a node whose ranks share node_cpus CPUs (a number, or a function giving it:
    called only when the answer depends on it)."""
    setting = (setting or "auto").strip().lower()
    if setting == "keep":
        return None, f"{ENV}=keep"
    if setting != "auto":
        try:
            n = int(setting, 10)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"smddp: {ENV}={setting!r}: expected auto, keep or a number of threads >= 1")
        return (n if n != threads_now else None), f"{ENV}={n}"
    if "OMP_NUM_THREADS" in env:
        return None, "OMP_NUM_THREADS is set"
    if threads_at_import is not None and threads_now != threads_at_import:
        return None, "torch.set_num_threads was called"
    try:
        local = int(env.get("LOCAL_WORLD_SIZE", ""))
    except ValueError:
        return None, "LOCAL_WORLD_SIZE unknown"
    if local <= 1:
        return None, "one rank on this node"
    if threads_now <= 1:
        return None, "torch has one thread"
    node = node_cpus() if callable(node_cpus) else node_cpus
    if node is None:
        return None, "the node's CPUs unknown"
    share = max(1, min(own_cpus, node // local))
    if share >= threads_now:
        return None, f"{local} ranks fit this node's {node} CPUs"
    return share, f"OMP_NUM_THREADS is unset and {local} ranks share this node's {node} CPUs"


def _exchange_keys(env, node_key):
    """The node's keys, [this rank's, every local rank's], or None where the local rank or size
    is unknown. node_key: the communicator's own (smddp._C.local_node_key: SMDDP_NODE_ID, else
    host name and boot id). A torchrun restart reuses its store: the attempt is in the keys."""
    try:
        local_rank, local = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if local <= 1 or not 0 <= local_rank < local:
        return None
    prefix = f"smddp/intra_op/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{node_key}/"
    return prefix + str(local_rank), [prefix + str(r) for r in range(local)]


def announce(store, env, node_key, own):
    """Puts this rank's CPUs where its node-mates look (every rank of the node does, whatever it
    decides, so that none waits for one that decided otherwise). False if it could not."""
    keys = _exchange_keys(env, node_key)
    if keys is None:
        return False
    try:
        store.set(keys[0], cpu_list(own))
        return True
    except Exception:  # noqa: BLE001 - a store that fails here fails init_process_group next
        return False


def node_cpus(store, env, node_key, timeout):
    """The number of CPUs in the union of the node's ranks' affinities (announce()), or None:
    a node-mate that did not say within `timeout` (LOCAL_WORLD_SIZE names more ranks than the
    node has), a store that failed, a value that is not a CPU list."""
    keys = _exchange_keys(env, node_key)
    if keys is None:
        return None
    try:
        store.wait(keys[1], timeout)
        union = set()
        for k in keys[1]:
            v = store.get(k)
            union |= parse_cpu_list(v.decode() if isinstance(v, (bytes, bytearray)) else str(v))
        return len(union) or None
    except Exception as e:  # noqa: BLE001 - whatever went wrong, torch's threads stay
        print(f"smddp: {ENV}: the node's ranks did not all say their CPUs within {timeout} "
              f"(is LOCAL_WORLD_SIZE={env.get('LOCAL_WORLD_SIZE')} this node's number of ranks?): "
              f"torch's threads left as they are ({e})", file=sys.stderr, flush=True)
        return None


# How long a rank waits for its node-mates' CPUs once its backend exists: every rank announced
# them before it began making its backend, and this rank's backend exists only once every rank
# has begun, so the keys are there unless LOCAL_WORLD_SIZE names more ranks than the node has.
COLLECT_TIMEOUT = timedelta(seconds=10)


def apply(store, size, node_key, create_backend, setting=None):
    """Makes the backend (create_backend()) and resizes torch's intra-op pool as plan() says, once
    per process, at the first backend that spans the world (every rank of the node creates it, so
    the exchange cannot wait on a rank outside a subgroup). Returns (backend, threads set or None).

    The CPUs are announced before the backend is made and read after: making it waits, up to
    init_process_group's timeout and naming whoever is missing, for every rank to arrive. Read
    before, a node-mate late to init_process_group (rank 0 downloading the model first) would have
    had to arrive within a wait of this module's own, or torch's threads stayed as they were."""
    global _decided
    env = os.environ
    if setting is None:
        setting = env.get(ENV, "auto")
    try:
        world = int(env.get("WORLD_SIZE", ""))
    except ValueError:
        world = None
    if _decided or size != world:
        plan(setting, env, 1, None, 1, 1)  # nothing to decide here; a bad value is still an error
        return create_backend(), None
    import torch
    try:
        own = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        own = set(range(os.cpu_count() or 1))
    plan(setting, env, 1, None, 1, 1)  # a bad value fails before anything is made
    # Every rank of the node announces its CPUs, whatever it decides.
    announced = announce(store, env, node_key, own)
    backend = create_backend()
    _decided = True  # not before: an init_process_group that failed and is tried again decides then
    now = torch.get_num_threads()
    n, why = plan(setting, env, now, _at_import, len(own),
                  lambda: node_cpus(store, env, node_key, COLLECT_TIMEOUT) if announced else None)
    if n is None:
        return backend, None
    torch.set_num_threads(n)
    if env.get("LOCAL_RANK", "0") == "0" and setting.strip().lower() in ("", "auto"):
        print(f"smddp: {why}: torch's intra-op threads set from {now} to {n} per rank, so that torch's "
              f"OpenMP pool does not spin on the cores the collectives need (as torchrun's OMP_NUM_THREADS=1; "
              f"{ENV}=keep leaves them)", file=sys.stderr, flush=True)
    return backend, n
