"""The package: alias module, python -m smddp.info, errors and timeouts as Python exceptions, a
/dev/shm without room."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO, WORKERS, assert_all_ok, child_env, free_port, tagged_processes, torchrun

SCRIPT = os.path.join(WORKERS, "alias_and_errors.py")


def test_sagemaker_alias_import(smddp_built):
    assert_all_ok(torchrun(SCRIPT, 2, "alias"), 2)


def test_bad_arguments_are_python_exceptions(smddp_built):
    assert_all_ok(torchrun(SCRIPT, 2, "bad_args"), 2)


def test_a_dataloader_worker_cannot_use_the_group_nor_end_it(smddp_built):
    assert_all_ok(torchrun(SCRIPT, 2, "dataloader_fork", timeout=180), 2)


def test_init_timeout_is_honoured_and_names_the_missing_rank(smddp_built):
    p = torchrun(SCRIPT, 2, "timeout", timeout=120)
    assert "rank 0 ALL OK" in p.stdout, (p.stdout + p.stderr)[-5000:]
    assert p.returncode == 0, (p.stdout + p.stderr)[-5000:]  # and neither rank crashed on its way out


SMALL_DEV_SHM = ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"', "sh"]


def test_a_dev_shm_without_room_is_a_clear_error_on_every_rank(smddp_built):
    # A container's /dev/shm (Docker: 64 MiB) in miniature, in a private mount namespace; where
    # this machine cannot make one (not root, no CAP_SYS_ADMIN), skipped.
    probe = subprocess.run(SMALL_DEV_SHM + ["true"], capture_output=True, text=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot mount a small /dev/shm in a private mount namespace here: " +
                    (probe.stderr.strip() if probe else "no unshare"))
    cmd = SMALL_DEV_SHM + [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port()}", SCRIPT, "small_shm"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=child_env(), cwd=REPO)
    assert_all_ok(p, 2)


def test_info_reports_version_build_and_settings(smddp_built):
    p = subprocess.run([sys.executable, "-m", "smddp.info"], capture_output=True, text=True, timeout=60,
                       env=child_env({"SMDDP_DEBUG": "INFO"}))
    assert p.returncode == 0, p.stderr
    for needle in ("smddp 0.", "libfabric=", "reduce kernels", "registered as 'smddp': True", "SMDDP_DEBUG",
                   "'INFO'   (from environment)", "providers:"):
        assert needle in p.stdout, p.stdout


def test_version_attribute(smddp_built):
    p = subprocess.run([sys.executable, "-c", "import smddp; print(smddp.__version__)"], capture_output=True,
                       text=True, timeout=60, env=child_env())
    assert p.returncode == 0 and p.stdout.strip().count(".") == 2, p.stdout + p.stderr


def test_a_process_a_test_started_is_found_by_its_tag(no_process_left_behind):
    """conftest's no_process_left_behind finds what a test left running by the tag child_env puts
    in its environment, also in a grandchild that started a session of its own (as torchrun's
    workers do), which killing the launcher on a timeout leaves behind."""
    sleeper = "import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], " \
              "start_new_session=True); print(os.getpid(), flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", sleeper], env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        p.stdout.readline()
        for _ in range(50):
            found = tagged_processes(no_process_left_behind)
            if len(found) >= 2:
                break
            time.sleep(0.1)
        assert p.pid in found and len(found) == 2, found
    finally:
        p.kill()
        p.wait()
    grandchild = [pid for pid in found if pid != p.pid]
    os.kill(grandchild[0], 9)
