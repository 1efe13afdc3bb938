"""The random soak against a locally computed oracle (workers/soak.py, #11): a short form in
make test; the long one is `tools/soak` (docs/reliability.md keeps its last result)."""
import os

import pytest

from conftest import WORKERS, assert_all_ok, torchrun


@pytest.mark.parametrize("nproc,nodes,ops", [(2, 1, 1500), (3, 1, 1000), (4, 1, 600), (4, 2, 400)],
                         ids=["w2", "w3", "w4", "2x2_nodes"])
def test_random_collectives_match_the_oracle(smddp_built, nproc, nodes, ops):
    p = torchrun(os.path.join(WORKERS, "soak.py"), nproc, str(ops), "11", str(nodes), timeout=600)
    assert_all_ok(p, nproc)
