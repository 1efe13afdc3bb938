"""Sparse allreduce through torch, against gloo in the same job (workers/sparse_allreduce.py):
the same bits, and DDP with a sparse embedding ending with gloo's parameters (#17)."""
import os

import pytest

from conftest import WORKERS, assert_all_ok, torchrun


@pytest.mark.parametrize("nproc", [2, 3])
def test_sparse_allreduce_matches_gloo(smddp_built, nproc):
    p = torchrun(os.path.join(WORKERS, "sparse_allreduce.py"), nproc, timeout=240)
    assert_all_ok(p, nproc)
