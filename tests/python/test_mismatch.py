"""Mismatched collectives through torch (workers/mismatch.py): an error on every rank, never a
silent result (#19)."""
import os

import pytest

from conftest import WORKERS, assert_all_ok, needs_hosts, run_on_two_hosts, torchrun


# Each world size's cases run one after another in one torchrun (each on a group of its own):
# a torch start-up per case was most of this file's time.
@pytest.mark.parametrize("cases,nproc", [
    ("count,dtype,root,kind,coalesced_split,ddp_extra_param,reduce_scatter_size,send_recv_size,send_recv_tag", 2),
    ("op,allgather_size,all_to_all_split", 3)])
def test_mismatch_is_an_error_on_every_rank(smddp_built, cases, nproc):
    p = torchrun(os.path.join(WORKERS, "mismatch.py"), nproc, cases, timeout=240)
    assert_all_ok(p, nproc)


# Across nodes (2 pretend nodes over libfabric): the odd rank is node 1's second rank, so node 0
# hears of it only through the cross-node fingerprint swap.
@pytest.mark.one_torch
def test_mismatch_across_nodes_is_an_error_on_every_rank(smddp_built):
    cases = "count,dtype,root,kind,op,coalesced_split,ddp_extra_param,reduce_scatter_size,send_recv_size,send_recv_tag"
    p = torchrun(os.path.join(WORKERS, "mismatch.py"), 4, cases, "2", timeout=300)
    assert_all_ok(p, 4)


# The same across two network-namespace hosts, torchrun on each: the fingerprints, and the
# messages whose tags disagree, cross a real link.
@pytest.mark.one_torch
@needs_hosts
def test_mismatch_across_namespace_hosts_is_an_error_on_every_rank(smddp_built):
    run_on_two_hosts("mismatch.py", "count,op,kind,allgather_size,send_recv_size,send_recv_tag", "2", timeout=300)
