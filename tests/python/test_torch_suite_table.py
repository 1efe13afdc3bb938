"""tests/torch_suite/table.py (what `make torch-suite` writes docs/torch-suite.md with): unittest's
verbose lines parsed, tests with docstrings included, gated skips and known exceptions explained,
anything else reported as ours to fix with exit status 1."""
import os
import subprocess
import sys

from conftest import REPO

TABLE = os.path.join(REPO, "tests", "torch_suite", "table.py")

GLOO = """test_a (__main__.T.test_a) ... ok
test_b (__main__.T.test_b)
Docstring of b ... ok
test_c (__main__.T.test_c) ... ok
test_get_backend (__main__.T.test_get_backend) ... ok
"""
SMDDP = """test_a (__main__.T.test_a) ... ok
test_b (__main__.T.test_b)
Docstring of b ... skipped 'Test requires backend smddp to be one of {'gloo'}'
test_c (__main__.T.test_c) ... ok
test_get_backend (__main__.T.test_get_backend) ... ok
"""
AS_GLOO_BROKEN = """test_a (__main__.T.test_a) ... FAIL
test_b (__main__.T.test_b)
Docstring of b ... ok
test_c (__main__.T.test_c) ... ok
test_get_backend (__main__.T.test_get_backend) ... ERROR
"""


def run(tmp_path, **logs):
    args = []
    for label, text in logs.items():
        p = tmp_path / f"{label}.log"
        p.write_text(text)
        args.append(f"{label.replace('_', '-')}={p}")
    return subprocess.run([sys.executable, TABLE, *args], capture_output=True, text=True)


def test_gated_skip_and_docstring_tests_are_explained(tmp_path):
    p = run(tmp_path, gloo=GLOO, smddp=SMDDP)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "| gloo | 4 | 4 | 0 | 0 |" in p.stdout
    assert "| test_b | skipped | torch skips it for any backend but gloo" in p.stdout


def test_a_real_failure_is_ours_to_fix_and_exceptions_are_named(tmp_path):
    p = run(tmp_path, gloo=GLOO, smddp_as_gloo=AS_GLOO_BROKEN)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "| test_a | fail | **ours to fix** |" in p.stdout
    assert "| test_get_backend | error | the as-gloo runner's" in p.stdout
