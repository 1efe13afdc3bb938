"""torch's intra-op threads when the launcher left OMP_NUM_THREADS unset (SMDDP_INTRA_OP_THREADS).

torch's OpenMP pool has a thread per CPU of the process by default, and every rank of a node has
one: with L ranks per node the node runs L times as many threads as it has cores. After each
parallel region (any large ATen operation of the model) libgomp's threads spin for some
milliseconds before they sleep, on the very cores the next collective's ranks need. Measured on
2 cores, 2 ranks, fp32 allreduce after a 1M-element multiply (docs/performance.md, "When the
cores are shared"): 8 B took 16-44x its time with one thread, and Open MPI and gloo lose as much.
torchrun sets OMP_NUM_THREADS=1 for this reason; mpirun, srun and SageMaker's MPI launcher do
not. By the time `import smddp` runs libgomp has read its environment, so the pool is resized
through torch instead, when the backend is created:

    auto   (default) where OMP_NUM_THREADS is unset, LOCAL_WORLD_SIZE (torchrun's, or filled from
           the launcher by launch_env) says L > 1 ranks share the node, and torch has the thread
           count it had at `import smddp` (no torch.set_num_threads since): give each rank its
           share of the node's CPUs, min(its own CPUs, node CPUs // L), at least 1, where torch
           has more (torch's default is a thread per physical core, libgomp's per CPU)
    keep   leave torch's threads as they are
    N      set N threads (N >= 1)

The node's CPUs are those of the cgroup's cpuset (a container's), else the online ones. Local
rank 0 says on stderr what was changed.
"""
import os

ENV = "SMDDP_INTRA_OP_THREADS"


def _node_cpus():
    """CPUs this job's node offers: the cgroup's effective cpuset (a container), else online."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"):
        try:
            with open(path) as f:
                n = count_cpu_list(f.read())
            if n:
                return n
        except OSError:
            pass
    return os.cpu_count() or 1


def count_cpu_list(text):
    """CPUs in a Linux cpu list: '0-3,8,10-11' -> 7; '' -> 0."""
    n = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


_at_import = None


def remember():
    """Called at `import smddp`: torch's count then is the one nobody chose after it."""
    global _at_import
    import torch
    _at_import = torch.get_num_threads()


def plan(setting, env, threads_now, threads_at_import, own_cpus, node_cpus):
    """(threads to set or None, why): what SMDDP_INTRA_OP_THREADS=setting asks of a rank whose
    torch has threads_now threads (threads_at_import at `import smddp`), whose affinity holds
    own_cpus CPUs, on a node of node_cpus."""
    setting = (setting or "auto").strip().lower()
    if setting == "keep":
        return None, "SMDDP_INTRA_OP_THREADS=keep"
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
    share = max(1, min(own_cpus, node_cpus // local))
    if share >= threads_now:
        return None, f"{local} ranks fit this node's {node_cpus} CPUs"
    return share, (f"OMP_NUM_THREADS is unset and {local} ranks share this node's {node_cpus} CPUs")


def apply(setting=None):
    """Resizes torch's intra-op pool as plan() says; returns the threads set, or None."""
    import torch
    env = os.environ
    if setting is None:
        setting = env.get(ENV, "auto")
    try:
        own = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        own = os.cpu_count() or 1
    now = torch.get_num_threads()
    n, why = plan(setting, env, now, _at_import, own, _node_cpus())
    if n is None:
        return None
    torch.set_num_threads(n)
    if env.get("LOCAL_RANK", "0") == "0" and setting.strip().lower() == "auto":
        import sys
        print(f"smddp: {why}: torch's intra-op threads set from {now} to {n} per rank, so that torch's "
              f"OpenMP pool does not spin on the cores the collectives need (as torchrun's OMP_NUM_THREADS=1; "
              f"{ENV}=keep leaves them)", file=sys.stderr, flush=True)
    return n
