"""Bad input at the torch surface (#11 item 6; workers/bad_input.py): a clear error naming the
argument and the rank, at once; the group still works after; a root-only mistake is an error on
every rank, not a hang."""
import os

import pytest

from conftest import WORKERS, assert_all_ok, torchrun


@pytest.mark.parametrize("nproc", [2, 3])
def test_bad_arguments_raise_clearly_and_leave_the_group_usable(smddp_built, nproc):
    p = torchrun(os.path.join(WORKERS, "bad_input.py"), nproc, timeout=300)
    assert_all_ok(p, nproc)
