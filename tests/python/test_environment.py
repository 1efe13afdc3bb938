"""The hermetic environment itself: torch importable, torchrun working (the no-libuv fix)."""
import os

import torch

from conftest import REPO


def test_torch_version_matches_suite():
    suite = os.environ.get("DEVENV_SUITE", "")
    expected = {"trixie": "2.6", "forky": "2.14"}.get(suite)
    if expected:
        assert torch.__version__.startswith(expected), torch.__version__


def test_torchrun_two_processes_gloo_allreduce(run_torchrun):
    p = run_torchrun(os.path.join(REPO, "tests/python/scripts_gloo_allreduce.py"), 2)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0/2 ok [0.0, 3.0, 6.0, 9.0, 12.0]" in p.stdout
    assert "rank 1/2 ok [0.0, 3.0, 6.0, 9.0, 12.0]" in p.stdout
