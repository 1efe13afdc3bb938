"""Receive from any source: never a hang (workers/p2p_any_source.py), and torch's own test of it
run repeatedly (tests/torch_suite/run_dist_suite.py)."""
import os
import subprocess
import sys

import pytest

from conftest import REPO, WORKERS, assert_all_ok, child_env, torchrun


def test_destroy_while_a_future_callback_needs_the_gil(smddp_built):
    p = torchrun(os.path.join(WORKERS, "p2p_any_source.py"), 2, "gil", timeout=120)
    assert_all_ok(p, 2)


@pytest.mark.one_torch
@pytest.mark.parametrize("nproc,nodes", [(2, 1), (3, 1), (4, 1), (4, 2), (3, 2)],
                         ids=["w2", "w3", "w4", "2x2_nodes", "2+1_nodes"])
def test_any_source_stress(smddp_built, nproc, nodes):
    rounds = 600 // nproc if nodes == 1 else 240 // nproc
    p = torchrun(os.path.join(WORKERS, "p2p_any_source.py"), nproc, "stress", str(rounds), str(nodes), timeout=300)
    assert_all_ok(p, nproc)


def test_torch_suite_send_recv_any_source_repeatedly(smddp_built):
    """torch's test_send_recv_any_source, 4 times in a row (SMDDP_ANY_SOURCE_RUNS=50 for the long form)."""
    runs = int(os.environ.get("SMDDP_ANY_SOURCE_RUNS", "4"))
    cmd = [sys.executable, os.path.join(REPO, "tests", "torch_suite", "run_dist_suite.py"), "--backend", "smddp",
           "--world", "2", "-k", "test_send_recv_any_source$", "--repeat", str(runs)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 30 * runs, env=child_env(), cwd=REPO)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert out.count("\nOK") == runs and "skipped=" not in out, out[-6000:]  # OK (skipped=1) ran nothing
