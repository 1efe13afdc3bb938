import os
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = os.path.join(REPO, "tests", "python", "workers")


def smddp_build_dir():
    """The build tree's importable package (tools/test-all builds it per suite)."""
    suite = os.environ.get("DEVENV_SUITE", "host")
    return os.environ.get("SMDDP_PYTHON_BUILD", os.path.join(REPO, "build", suite, "python"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra=None):
    e = dict(os.environ)
    paths = [smddp_build_dir(), WORKERS]
    if e.get("PYTHONPATH"):
        paths.append(e["PYTHONPATH"])
    e["PYTHONPATH"] = os.pathsep.join(paths)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update(extra or {})
    return e


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


@pytest.fixture
def run_torchrun():
    return torchrun


@pytest.fixture(scope="session")
def smddp_built():
    d = smddp_build_dir()
    if not os.path.isdir(os.path.join(d, "smddp")):
        pytest.fail(f"the smddp extension is not built at {d} (tools/test-all builds it; or set SMDDP_PYTHON_BUILD)")
    return d
