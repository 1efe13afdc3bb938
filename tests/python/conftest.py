import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = os.path.join(REPO, "tests", "python", "workers")


def package_module(name):
    """python/smddp/<name>.py alone, from the source tree, for modules that need only the standard
    library (launch_env, intra_op): their rules are tested without building the package."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("smddp_" + name, os.path.join(REPO, "python", "smddp", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def smddp_build_dir():
    """The build tree's importable package (tools/test-all builds it per suite)."""
    suite = os.environ.get("DEVENV_SUITE", "host")
    return os.environ.get("SMDDP_PYTHON_BUILD", os.path.join(REPO, "build", suite, "python"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every process a test starts through child_env carries the test's tag in its environment, and so
# do their children (torchrun's workers, mpirun's ranks, srun's tasks), which is how
# no_process_left_behind finds what a test left running (a launcher killed on its timeout leaves
# its workers: torchrun starts them in sessions of their own).
TEST_TAG = "SMDDP_PYTEST_TAG"
_current_tag = [None]


def child_env(extra=None):
    e = dict(os.environ)
    paths = [smddp_build_dir(), WORKERS]
    if e.get("PYTHONPATH"):
        paths.append(e["PYTHONPATH"])
    e["PYTHONPATH"] = os.pathsep.join(paths)
    e.setdefault("OMP_NUM_THREADS", "1")
    if _current_tag[0]:
        e[TEST_TAG] = _current_tag[0]
    e.update(extra or {})
    return e


def tagged_processes(tag):
    """Live (not zombie) processes other than this one whose environment carries `tag`."""
    needle = f"{TEST_TAG}={tag}".encode() + b"\0"
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and (env.startswith(needle) or b"\0" + needle in env):
            found.append(int(pid))
    return found


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every process a test started is gone when it ends (ranks may still be exiting: up to 10 s);
    what is not is killed, so the next tests get the cores and /dev/shm, and the test fails."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    _current_tag[0] = tag
    yield tag
    _current_tag[0] = None
    left = tagged_processes(tag)
    deadline = time.time() + 10
    while left and time.time() < deadline:
        time.sleep(0.1)
        left = tagged_processes(tag)
    if left:
        names = []
        for pid in left:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    names.append(f"{pid} {f.read().replace(bytes(1), b' ').decode(errors='replace')[:120]}")
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        pytest.fail("processes left running (killed now): " + "; ".join(names))


def torchrun(script, nproc, *args, timeout=300, env=None):
    """Runs `torchrun --nproc_per_node=nproc script args`; returns the CompletedProcess."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={free_port()}", script, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(env), cwd=REPO)


def assert_all_ok(p, nproc):
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    for r in range(nproc):
        assert f"rank {r} ALL OK" in p.stdout, out[-6000:]


TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


def launcher_env(extra):
    """The test's environment with extra launcher variables and none of torchrun's."""
    return {k: v for k, v in child_env(extra).items() if k not in TORCHRUN_VARS}


# --- tests that make test runs on one torch only ---
# What they test does not change with torch's version: the transport across (pretend) hosts,
# launchers and Slurm, packaging, benchmarks' scripts, long soaks. tools/test-all runs them in
# the trixie root, which also has mpirun, Slurm and root for namespaces, and leaves them out in
# forky's (-m "not one_torch"), where the tests of the binding to torch 2.14 run. By hand,
# pytest runs everything.
one_torch = pytest.mark.one_torch


def pytest_configure(config):
    config.addinivalue_line("markers", "one_torch: torch-version-independent; make test runs it in one root")


# --- network-namespace hosts (tools/netns) ---
NETNS = os.path.join(REPO, "tools", "netns")
needs_hosts = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                 reason="network-namespace hosts need root and iproute2")


class NamespaceHosts:
    """Pretend hosts; each host's name is its namespace's and resolves inside every host. What a
    site would set per host (SMDDP_NODE_ID: the pretend hosts share one kernel; the link for
    libfabric's tcp provider and gloo) is set as tests/launchers/netns_ssh sets it."""

    def __init__(self, n):
        self.id = subprocess.run([NETNS, "up", str(n)], capture_output=True, text=True, check=True).stdout.strip()
        self.names = [f"smddp-{self.id}-h{i}" for i in range(n)]

    def site_env(self, i, extra):
        return launcher_env(dict(extra, SMDDP_NODE_ID=self.names[i], FI_TCP_IFACE="eth0", GLOO_SOCKET_IFNAME="eth0"))

    def torchrun(self, script, nproc_per_host, *args, timeout=600, env=None):
        """torchrun on every host (--nnodes, --node_rank, host 0 the master); returns
        (return codes, the hosts' outputs joined). Every launcher is killed on a timeout."""
        port = str(free_port())
        procs = []
        for i, name in enumerate(self.names):
            cmd = ["ip", "netns", "exec", name, sys.executable, "-m", "torch.distributed.run",
                   f"--nnodes={len(self.names)}", f"--node_rank={i}", f"--nproc_per_node={nproc_per_host}",
                   f"--master_addr={self.names[0]}", f"--master_port={port}", script, *args]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          env=self.site_env(i, env or {}), cwd=REPO))
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=timeout)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return [p.returncode for p in procs], "".join(outs)

    def close(self):
        subprocess.run([NETNS, "down", self.id], capture_output=True)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"smddp-{self.id}-" not in left, left


def run_on_two_hosts(worker, *args, timeout, env=None):
    """torchrun of workers/`worker` on two namespace hosts x 2 ranks; asserts every rank passed
    and returns the output (removing the hosts whatever happened)."""
    hosts = NamespaceHosts(2)
    try:
        codes, out = hosts.torchrun(os.path.join(WORKERS, worker), 2, *args, timeout=timeout, env=env)
    finally:
        hosts.close()
    assert codes == [0, 0], out[-6000:]
    for r in range(4):
        assert f"rank {r} ALL OK" in out, out[-6000:]
    return out


def smddp_segments():
    return set(glob.glob("/dev/shm/smddp*"))


@pytest.fixture(autouse=True)
def no_segment_left_behind(no_process_left_behind):  # checked after the processes are gone
    """Every test, whatever launched its ranks (torchrun, mpirun, srun, a SageMaker-shaped
    launcher, spawn), leaves no shared-memory segment of ours: a segment is unlinked once every
    rank mapped it, so one still named after the ranks exited is a leak. Its ranks may still be
    exiting when the test returns: wait a little first."""
    before = smddp_segments()
    yield
    for _ in range(50):
        left = smddp_segments() - before
        if not left:
            return
        time.sleep(0.1)
    pytest.fail(f"shared-memory segments left behind: {sorted(left)}")


@pytest.fixture
def run_torchrun():
    return torchrun


@pytest.fixture(scope="session")
def smddp_built():
    d = smddp_build_dir()
    if not os.path.isdir(os.path.join(d, "smddp")):
        pytest.fail(f"the smddp extension is not built at {d} (tools/test-all builds it; or set SMDDP_PYTHON_BUILD)")
    return d
