"""SMDDP_INTRA_OP_THREADS (#18): where the launcher left OMP_NUM_THREADS unset, every rank's
torch OpenMP pool would spin on the cores the collectives need; the backend gives each rank its
share of the node's CPUs. The rule (smddp.intra_op.plan) on the layouts users have, then real
ranks under torchrun with OMP_NUM_THREADS removed before torch loads."""
import os
import re

import pytest

from conftest import WORKERS, package_module, torchrun


def _intra_op():
    return package_module("intra_op")


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


def test_cpu_lists_round_trip():
    m = _intra_op()
    assert m.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert m.cpu_list({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert m.cpu_list({5}) == "5" and m.parse_cpu_list("") == set()


def test_the_node_is_asked_only_when_the_answer_depends_on_it():
    asked = []

    def node():
        asked.append(1)
        return 2
    plan = _intra_op().plan
    for setting, env in (("keep", LOCAL2), ("3", LOCAL2), ("auto", dict(LOCAL2, OMP_NUM_THREADS="1")), ("auto", {})):
        plan(setting, env, 2, 2, 2, node)
    assert not asked
    assert plan("auto", LOCAL2, 2, 2, 2, node)[0] == 1 and asked == [1]


class DictStore:
    """The c10d Store calls the exchange makes, over a dict; wait() raises where a key is missing,
    as a store's timeout does."""

    def __init__(self):
        self.d = {}

    def set(self, k, v):
        self.d[k] = v.encode() if isinstance(v, str) else v

    def get(self, k):
        return self.d[k]

    def wait(self, keys, timeout):
        missing = [k for k in keys if k not in self.d]
        if missing:
            raise RuntimeError(f"timeout waiting for {missing}")


def _rank_env(local_rank, **extra):
    return dict({"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": "2"}, **extra)


def test_the_node_is_the_union_of_its_ranks_cpus():
    m, store = _intra_op(), DictStore()
    from datetime import timedelta
    assert m.announce(store, _rank_env(0), "n0", {0, 1}) and m.announce(store, _rank_env(1), "n0", {2, 3, 1})
    assert m.node_cpus(store, _rank_env(0), "n0", timedelta(seconds=1)) == 4
    # another node's ranks, and a restarted attempt, are apart
    assert m.announce(store, _rank_env(0), "n1", {0})
    assert m.node_cpus(store, _rank_env(0), "n1", timedelta(seconds=1)) is None
    assert m.node_cpus(store, _rank_env(0, TORCHELASTIC_RESTART_COUNT="1"), "n0", timedelta(seconds=1)) is None
    # a value that is not a CPU list leaves the threads
    store.set(next(k for k in store.d if "/n0/" in k), "garbage")
    assert m.node_cpus(store, _rank_env(1), "n0", timedelta(seconds=1)) is None
    # no local rank or size: nothing said, nothing asked
    assert not m.announce(store, {"LOCAL_WORLD_SIZE": "2"}, "n0", {0}) and m.node_cpus(store, {}, "n0", timedelta(seconds=1)) is None


def test_a_subgroups_backend_asks_nobody(monkeypatch):
    m, store = _intra_op(), DictStore()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert m.apply(store, 2, "n0", lambda: "backend", "auto") == ("backend", None)
    assert store.d == {}
    with pytest.raises(ValueError, match="SMDDP_INTRA_OP_THREADS"):
        m.apply(store, 2, "n0", lambda: "backend", "bad")


def test_a_node_mate_late_to_init_still_counts(monkeypatch):
    """A node-mate may reach init_process_group long after this rank (rank 0 fetching the model
    first): its CPUs are read once the backend exists, which is once every rank has arrived, so
    no wait of intra_op's own can run out first and leave torch's threads as they were."""
    import torch
    m, store = _intra_op(), DictStore()
    for k, v in {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(m, "_decided", False)
    monkeypatch.setattr(m, "_at_import", None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    threads = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    monkeypatch.setattr(torch, "set_num_threads", threads.append)

    def backend_made_once_the_late_rank_arrived():
        assert any(k.endswith("/n0/0") for k in store.d), "this rank's CPUs are said before its backend is made"
        m.announce(store, _rank_env(1), "n0", {2, 3})  # the node-mate arrives; its backend is made
        return "backend"

    assert m.apply(store, 2, "n0", backend_made_once_the_late_rank_arrived) == ("backend", 2)
    assert threads == [2]  # 4 CPUs shared by 2 ranks


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
    # Both ranks have this process's affinity: the node's CPUs are those, shared by 2.
    own = len(os.sched_getaffinity(0))
    share = max(1, own // 2)
    # The ranks start with more threads than their share, as libgomp's default (a thread per
    # physical core) gives them on a larger machine than this one (2 vCPUs, one core): set
    # before import smddp, which the rule cannot tell from the default.
    got, out = _threads(torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "unset", f"{4 * share} before",
                                 timeout=180, env={"SMDDP_INTRA_OP_THREADS": "auto"}))
    before = got[0][0]
    assert before == 4 * share, out[-3000:]
    for r in range(2):
        # before: torch's default; after: the rank's share where that is less; a subgroup: unchanged
        assert got[r] == (before, min(before, share), min(before, share)), (got, out[-3000:])
    assert out.count("torch's intra-op threads set from") == 1, out[-3000:]  # local rank 0 only


def test_keep_and_omp_set_leave_torchs_threads(smddp_built):
    got, out = _threads(torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "unset", timeout=180,
                                 env={"SMDDP_INTRA_OP_THREADS": "keep"}))
    assert all(g[0] == g[1] == g[2] > 0 for g in got.values()), got
    assert "intra-op threads set" not in out
    # a script's own torch.set_num_threads after import smddp stays
    got, out = _threads(torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "unset", "after", timeout=180,
                                 env={"SMDDP_INTRA_OP_THREADS": "auto"}))
    assert all(g[0] == g[1] == g[2] > 1 for g in got.values()), got
    assert "intra-op threads set" not in out
    # the launcher's OMP_NUM_THREADS=1 stays
    got, out = _threads(torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "set", timeout=180,
                                 env={"SMDDP_INTRA_OP_THREADS": "auto", "OMP_NUM_THREADS": "1"}))
    assert all(g == (1, 1, 1) for g in got.values()), got


def test_a_bad_value_fails_init_with_its_name(smddp_built):
    p = torchrun(os.path.join(WORKERS, "intra_op_threads.py"), 2, "unset", timeout=180,
                 env={"SMDDP_INTRA_OP_THREADS": "lots"})
    for r in range(2):
        assert re.search(rf"rank {r} init failed: .*SMDDP_INTRA_OP_THREADS='lots'", p.stdout), \
            (p.stdout + p.stderr)[-3000:]
