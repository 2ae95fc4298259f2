"""The ViT MLP (L2 ``vit_mlp``, ``Dinov2MLP``; SigLIP's ``SiglipMLP`` is the same class): the
reference's fast path against its definition, an honest plain-PyTorch tree passing every case, a
wrong one failing every case, and the L2 class composing into both towers' L3 blocks."""
import json

import pytest
import torch

from conftest import CANDIDATES, ROOT, run_suite_in_process, suite_args
from kernels_reference.L2.vit_mlp import Dinov2MLP
from kernels_reference.L3.siglip_encoder_layer import SiglipMLP
from test_verdicts import assert_fails_exactly, assert_passes_every_case


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh"])
def test_forward_matches_native(act):
    mlp = Dinov2MLP(48, 136, act)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5 if p.dim() == 2 else 0.1))
    x = torch.randn(2, 7, 48, generator=gen)
    torch.testing.assert_close(mlp(x), mlp.forward_native(x), rtol=1e-5, atol=1e-5)
    assert SiglipMLP is Dinov2MLP  # one class: a candidate's replaces it in both towers


@pytest.mark.parametrize("tree", [CANDIDATES / "vit_mlp_plain", ROOT / "kernels_reference"], ids=["plain", "reference"])
def test_honest_trees_pass_every_case(tree):
    assert_passes_every_case("vit_mlp", tree)


def test_bias_after_the_gelu_fails_every_case():
    assert_fails_exactly("vit_mlp", "vit_mlp_bias_after_gelu", lambda c: True)


def test_a_wrong_mlp_fails_both_towers_blocks_when_composed(tmp_path):
    report = tmp_path / "r.json"
    run_suite_in_process(suite_args(["-k", "(dinov2_layer or siglip_encoder_layer) and correctness",
                                     f"--fk-candidate={CANDIDATES / 'vit_mlp_bias_after_gelu'}",
                                     "--fk-mode=composed", f"--fk-report={report}"]), tmp_path)
    tasks = {t["name"]: t["status"] for t in json.loads(report.read_text())["tasks"]}
    assert tasks == {"dinov2_layer": "WRONG_RESULT", "siglip_encoder_layer": "WRONG_RESULT"}, tasks
