"""`pip install .` (scikit-build-core driving the top-level CMake) into a fresh virtual
environment that sees the suite's torch, then a one-process job with backend="smddp"."""
import os
import subprocess
import sys

import pytest

from conftest import REPO

JOB = """
import torch, torch.distributed as dist, smddp, smdistributed.dataparallel.torch.torch_smddp
assert smddp.__file__.startswith(%r), smddp.__file__
dist.init_process_group("smddp", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
t = torch.arange(4.0)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
dist.destroy_process_group()
print("pip-installed smddp", smddp.__version__, "ok")
"""

pytestmark = pytest.mark.one_torch  # see conftest.py


def test_pip_install_builds_and_runs(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # No network here: build with the suite's scikit-build-core/pybind11 (no build isolation).
    p = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "-q",
                        REPO], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)})
    assert p.returncode == 0, (p.stdout + p.stderr)[-5000:]
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([py, "-c", JOB % (site, port)], capture_output=True, text=True, timeout=120, env=env,
                       cwd=str(tmp_path))
    assert r.returncode == 0 and "pip-installed smddp" in r.stdout, r.stdout + r.stderr
