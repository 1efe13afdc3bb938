"""DDP and FSDP training under smddp gives the same parameters as under gloo (same run)."""
import os

import pytest
import torch

from conftest import WORKERS, assert_all_ok, torchrun

SCRIPT = os.path.join(WORKERS, "train_compare.py")
TORCH = tuple(int(x) for x in torch.__version__.split(".")[:2])


@pytest.mark.parametrize("mode", ["ddp_toy", "ddp_cnn", "ddp_hook", "ddp_powersgd", "ddp_join", "fsdp1"])
def test_training_matches_gloo(smddp_built, mode):
    assert_all_ok(torchrun(SCRIPT, 2, mode), 2)


def test_hybrid_shard_with_subgroups(smddp_built):
    assert_all_ok(torchrun(SCRIPT, 4, "hybrid"), 4)


@pytest.mark.skipif(TORCH < (2, 14), reason="FSDP2 fully_shard trains on CPU from torch 2.14 (forky suite)")
def test_fsdp2_fully_shard(smddp_built):
    assert_all_ok(torchrun(SCRIPT, 2, "fsdp2"), 2)
