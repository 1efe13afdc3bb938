"""The GPU suite's PyTorch half (workers/gpu_collectives.py): CUDA tensors through smddp against
gloo on CPU copies, DDP on CUDA against DDP on CPU. Needs a torch with CUDA and a GPU; Debian's
torch is CPU-only, so here every test reports skipped with the reason. tools/gpu-check runs it on
a GPU machine."""
import os

import pytest
import torch

from conftest import WORKERS, assert_all_ok, torchrun

SCRIPT = os.path.join(WORKERS, "gpu_collectives.py")

if not torch.cuda.is_available():
    why = ("this torch has no CUDA (Debian's torch is CPU-only)" if not torch.backends.cuda.is_built()
           else "no CUDA device is visible")
    pytestmark = pytest.mark.skip(reason=f"no GPU: {why}")


@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_cuda_tensors_match_gloo_on_cpu(smddp_built, nproc):
    assert_all_ok(torchrun(SCRIPT, nproc, timeout=900), nproc)
