"""Hugging Face Trainer + accelerate over smddp, matching gloo (#10): the same small model and
data trained by two torchrun jobs, one per backend, end with the same parameters."""
import importlib.util
import os

import pytest
import torch

from conftest import WORKERS, assert_all_ok, torchrun

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None or
                              importlib.util.find_spec("accelerate") is None,
                              reason="transformers/accelerate not installed (the forky devenv has them)")


@needs_hf
def test_trainer_over_smddp_matches_gloo(smddp_built, tmp_path):
    params = {}
    for backend in ("smddp", "gloo"):
        out = tmp_path / f"{backend}.pt"
        p = torchrun(os.path.join(WORKERS, "hf_trainer.py"), 2, backend, str(out), timeout=600)
        assert_all_ok(p, 2)
        params[backend] = torch.load(out)
    s, g = params["smddp"], params["gloo"]
    assert s.shape == g.shape
    assert torch.allclose(s, g, rtol=1e-4, atol=1e-5), (s - g).abs().max().item()
