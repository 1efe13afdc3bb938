"""Mismatched collectives through torch (workers/mismatch.py): an error on every rank, never a
silent result (#19)."""
import os

import pytest

from conftest import WORKERS, assert_all_ok, needs_hosts, run_on_two_hosts, torchrun


@pytest.mark.parametrize("case,nproc", [("count", 2), ("dtype", 2), ("root", 2), ("op", 3), ("kind", 2),
                                        ("coalesced_split", 2), ("ddp_extra_param", 2), ("allgather_size", 3),
                                        ("reduce_scatter_size", 2), ("all_to_all_split", 3), ("send_recv_size", 2),
                                        ("send_recv_tag", 2)])
def test_mismatch_is_an_error_on_every_rank(smddp_built, case, nproc):
    p = torchrun(os.path.join(WORKERS, "mismatch.py"), nproc, case, timeout=120)
    assert_all_ok(p, nproc)


# Across nodes (2 pretend nodes over libfabric): the odd rank is node 1's second rank, so node 0
# hears of it only through the cross-node fingerprint swap.
@pytest.mark.parametrize("case", ["count", "dtype", "root", "kind", "op", "coalesced_split", "ddp_extra_param",
                                  "reduce_scatter_size", "send_recv_size"])
def test_mismatch_across_nodes_is_an_error_on_every_rank(smddp_built, case):
    p = torchrun(os.path.join(WORKERS, "mismatch.py"), 4, case, "2", timeout=180)
    assert_all_ok(p, 4)


# The same across two network-namespace hosts, torchrun on each: the fingerprints cross a real
# link. (A send/recv tag mismatch across nodes is not detected: libfabric matches tags, so the
# receive waits for its timeout; docs/reliability.md.)
@needs_hosts
@pytest.mark.parametrize("case", ["count", "op", "kind", "allgather_size", "send_recv_size"])
def test_mismatch_across_namespace_hosts_is_an_error_on_every_rank(smddp_built, case):
    run_on_two_hosts("mismatch.py", case, "2", timeout=240)
