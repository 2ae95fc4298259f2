"""SigLIP-2's vision tower: the encoder layer (L3) and the vision model (L4). The model refuses
images off its native grid; the tasks' verdicts on the honest example tree and on wrong candidates,
each failing on every CPU case. Agreement with Hugging Face is tests/test_hf_siglip.py.

SigLIP's tanh GELU swapped for the exact one is not among the wrong candidates: the two differ by
at most about 5e-4 of an activation, under bf16's rounding of the MLP, and the calibrated bar passes it
(the task measures what bf16 serving can tell apart)."""
import pytest
import torch

from kernels_reference.L4.siglip import SiglipVisionModel

from conftest import EXAMPLES
from test_verdicts import assert_fails_exactly, assert_passes_every_case

TINY = dict(hidden_size=16, num_attention_heads=2, intermediate_size=24, num_hidden_layers=1, image_size=48,
            patch_size=14, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")


def test_vision_model_refuses_another_grid():
    model = SiglipVisionModel(TINY)
    assert model(torch.zeros(1, 3, 42, 55)).shape == (1, 9, 16)  # 3 x 3 patches: the native grid
    with pytest.raises(ValueError, match=r"56x56 image is a 4 x 4 patch grid.*native 3 x 3 grid only"):
        model(torch.zeros(1, 3, 56, 56))


@pytest.mark.parametrize("task_name", ["siglip_encoder_layer", "siglip_vision_model"])
def test_honest_example_candidates_pass_every_case(task_name):
    assert_passes_every_case(task_name, EXAMPLES)


@pytest.mark.parametrize("task_name, tree", [
    ("siglip_encoder_layer", "siglip_residual_from_norm"),
    ("siglip_vision_model", "siglip_no_post_layernorm"),
], ids=["residual-from-norm", "no-post-layernorm"])
def test_wrong_candidates_fail_every_case(task_name, tree):
    assert_fails_exactly(task_name, tree, lambda c: True)
