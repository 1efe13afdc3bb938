"""Every collective under smddp vs gloo in the same processes (workers/collectives_vs_gloo.py)."""
import os

import pytest
import torch

from conftest import WORKERS, assert_all_ok, torchrun


@pytest.mark.parametrize("nproc", [1, 2, 3, 4])
def test_every_collective_matches_gloo(smddp_built, nproc):
    p = torchrun(os.path.join(WORKERS, "collectives_vs_gloo.py"), nproc, timeout=600)
    assert_all_ok(p, nproc)


@pytest.mark.one_torch
def test_every_collective_across_pretend_nodes(smddp_built):
    """4 ranks as 2 nodes x 2: the backend's cross-node path (libfabric between, shm inside)."""
    p = torchrun(os.path.join(WORKERS, "collectives_vs_gloo.py"), 4, timeout=600, env={"SMDDP_TEST_NODES": "2"})
    assert_all_ok(p, 4)


def test_a_callback_waiting_on_a_receive_inside_it_gets_an_error_not_a_hang(smddp_built):
    p = torchrun(os.path.join(WORKERS, "callback_waits.py"), 2, timeout=120)
    assert_all_ok(p, 2)


def test_sync_calls_finish_on_return_async_calls_do_not_block(smddp_built):
    """torch's synchronous calls run on the caller's thread; async_op=True still overlaps."""
    p = torchrun(os.path.join(WORKERS, "call_modes.py"), 2, timeout=300)
    assert_all_ok(p, 2)


@pytest.mark.skipif(not hasattr(torch.distributed.ProcessGroup, "split_group"),
                    reason="this torch cannot split a backend (ProcessGroup.split_group: torch 2.14, forky suite)")
@pytest.mark.parametrize("nodes", [1, 2])
def test_groups_split_from_the_backend_match_gloos(smddp_built, nodes):
    """torch's split_group, a device mesh and new_group over a default group that splits (as with
    init_process_group(device_id=...) on GPUs): every subgroup's collectives against gloo's, on
    one node and on two pretend ones (libfabric between them)."""
    p = torchrun(os.path.join(WORKERS, "split_groups.py"), 4, timeout=300, env={"SMDDP_TEST_NODES": str(nodes)})
    assert_all_ok(p, 4)
