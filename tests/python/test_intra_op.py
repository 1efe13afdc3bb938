"""SMDDP_INTRA_OP_THREADS (#18): where the launcher left OMP_NUM_THREADS unset, every rank's
torch OpenMP pool would spin on the cores the collectives need; the backend gives each rank its
share of the node's CPUs. The rule (smddp.intra_op.plan) on the layouts users have, then real
ranks under torchrun with OMP_NUM_THREADS removed before torch loads."""
import os
import re

import pytest

from conftest import WORKERS, REPO, torchrun


def _intra_op():
    # The module alone, from the source tree: plan() needs only the standard library.
    import importlib.util
    spec = importlib.util.spec_from_file_location("smddp_intra_op", os.path.join(REPO, "python", "smddp",
                                                                                  "intra_op.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LOCAL2 = {"LOCAL_WORLD_SIZE": "2"}


@pytest.mark.parametrize("own,node,local,now,want", [
    (2, 2, 2, 2, 1),        # this machine: 2 ranks, 2 cores
    (2, 2, 4, 2, 1),        # more ranks than cores: still one thread each
    (96, 96, 8, 96, 12),    # p4d, unbound (mpirun --bind-to none, SageMaker), libgomp's default
    (96, 96, 8, 48, 12),    # the same where torch defaults to a thread per physical core
    (48, 96, 8, 24, 12),    # bound to a socket of 48 CPUs that 4 ranks share
    (8, 8, 2, 8, 4),        # a container with a cpuset of 8
    (1, 96, 8, 1, None),    # bound to a core: libgomp already has 1
    (12, 96, 8, 12, None),  # bound to its share already
])
def test_auto_gives_each_rank_its_share(own, node, local, now, want):
    n, why = _intra_op().plan("auto", {"LOCAL_WORLD_SIZE": str(local)}, now, now, own, node)
    assert n == want, why


def test_auto_leaves_what_someone_chose():
    plan = _intra_op().plan
    assert plan("auto", dict(LOCAL2, OMP_NUM_THREADS="2"), 2, 2, 2, 2)[0] is None
    assert plan("auto", LOCAL2, 2, 1, 2, 2)[0] is None  # torch.set_num_threads after import smddp
    assert plan("auto", {}, 2, 2, 2, 2)[0] is None  # ranks per node unknown
    assert plan("auto", {"LOCAL_WORLD_SIZE": "1"}, 2, 2, 2, 2)[0] is None
    assert plan("", LOCAL2, 2, 2, 2, 2)[0] == 1  # empty means the default


def test_keep_and_a_number():
    plan = _intra_op().plan
    assert plan("keep", LOCAL2, 2, 2, 2, 2)[0] is None
    assert plan("3", dict(LOCAL2, OMP_NUM_THREADS="1"), 1, 1, 2, 2)[0] == 3
    assert plan("2", LOCAL2, 2, 2, 2, 2)[0] is None  # already so


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_a_bad_value_names_the_variable(bad):
    with pytest.raises(ValueError, match=r"SMDDP_INTRA_OP_THREADS='%s': expected auto, keep" % re.escape(bad)):
        _intra_op().plan(bad, LOCAL2, 2, 2, 2, 2)


def test_cpu_list():
    count = _intra_op().count_cpu_list
    assert count("0-3,8,10-11\n") == 7
    assert count("5") == 1
    assert count("") == 0


def _threads(p):
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    got = {}
    for r in range(2):
        m = re.search(rf"rank {r} threads (\d+) (\d+) (\d+)", p.stdout)
        assert m and f"rank {r} ALL OK" in p.stdout, out[-4000:]
        got[r] = tuple(int(x) for x in m.groups())
    return got, out


def test_ranks_with_omp_unset_get_their_share(smddp_built):
    own = len(os.sched_getaffinity(0))
    share = max(1, min(own, (os.cpu_count() or 1) // 2))
    got, out = _threads(torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "unset", timeout=180,
                                 env={"SMDDP_INTRA_OP_THREADS": "auto"}))
    before = got[0][0]
    for r in range(2):
        # before: torch's default; after: the rank's share where that is less; a subgroup: unchanged
        assert got[r] == (before, min(before, share), min(before, share)), (got, out[-3000:])
    if share < before:
        assert out.count("torch's intra-op threads set from") == 1, out[-3000:]  # local rank 0 only


def test_keep_and_omp_set_leave_torchs_threads(smddp_built):
    got, out = _threads(torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "unset", timeout=180,
                                 env={"SMDDP_INTRA_OP_THREADS": "keep"}))
    assert all(g[0] == g[1] == g[2] > 0 for g in got.values()), got
    assert "intra-op threads set" not in out
    # a script's own torch.set_num_threads after import smddp stays
    got, out = _threads(torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "unset", "3", timeout=180))
    assert all(g == (3, 3, 3) for g in got.values()), got
    assert "intra-op threads set" not in out
    # torchrun's OMP_NUM_THREADS=1 stays
    got, out = _threads(torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "set", timeout=180))
    assert all(g == (1, 1, 1) for g in got.values()), got


def test_a_bad_value_fails_init_with_its_name(smddp_built):
    p = torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "unset", timeout=180,
                 env={"SMDDP_INTRA_OP_THREADS": "lots"})
    for r in range(2):
        assert re.search(rf"rank {r} init failed: .*SMDDP_INTRA_OP_THREADS='lots'", p.stdout), \
            (p.stdout + p.stderr)[-3000:]
