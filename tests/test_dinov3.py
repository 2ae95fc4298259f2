"""DINOv3's layer (L3) and image encoder (L4): the model refuses images it cannot read and reads any
grid of whole patches, the layer's CUDA-path code (run here on the CPU) matches its native
definition, and the tasks' verdicts on the honest example tree and on wrong candidates, each failing
exactly on the cases that can see its bug. The 2-D rotary embedding's own task is tests/test_rope_2d.py;
agreement with Hugging Face is tests/test_hf_dinov3.py."""
import pytest
import torch

from kernels_reference.L3.dinov3_layer import DINOv3ViTLayer
from kernels_reference.L4.dinov3 import DINOv3ViTModel

from conftest import EXAMPLES
from test_verdicts import assert_fails_exactly, assert_passes_every_case

TINY = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, num_hidden_layers=1, num_register_tokens=4,
            patch_size=16)


@pytest.mark.parametrize("shape, message", [
    ((3, 32, 32), r"DINOv3ViTModel expects pixel_values \[B, 3, H, W\]; got shape \(3, 32, 32\)"),
    ((1, 1, 32, 32), r"DINOv3ViTModel expects pixel_values \[B, 3, H, W\]; got shape \(1, 1, 32, 32\)"),
    ((1, 3, 15, 40), r"a 15x40 image holds no whole 16x16 patch"),
], ids=["3-d", "grey", "under-a-patch"])
def test_model_refuses_images_it_cannot_read(shape, message):
    with pytest.raises(ValueError, match=message):
        DINOv3ViTModel(TINY)(torch.zeros(shape))


def test_model_reads_whole_patches_of_any_grid():
    """1 class + 4 registers + 3 x 5 patches; the pixels past the last whole patch do not matter."""
    model = DINOv3ViTModel(TINY)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape))
        pixels = torch.randn(2, 3, 48 + 7, 80 + 15)
        out = model(pixels)
        cropped = model(pixels[:, :, :48, :80].contiguous())
    assert out.shape == (2, 1 + 4 + 15, 32)
    torch.testing.assert_close(out, cropped, rtol=0, atol=0)


def test_layer_forward_matches_native():
    """On the CPU ``forward`` differs from ``forward_native`` only in the LayerScale step (addcmul)."""
    layer = DINOv3ViTLayer(TINY)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5 if p.dim() == 2 else 0.3))
    x = torch.randn(2, 5 + 6, 32, generator=gen)
    torch.testing.assert_close(layer(x, 2, 3), layer.forward_native(x, 2, 3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("task_name", ["dinov3_layer", "dinov3_model"])
def test_honest_example_candidates_pass_every_case(task_name):
    assert_passes_every_case(task_name, EXAMPLES)


@pytest.mark.parametrize("task_name, tree, failing", [
    # every CPU case has the 4 registers between the class token and the patches
    ("dinov3_layer", "dinov3_layer_registers_as_patches", lambda c: True),
    # a transposed grid is the same grid on a square image
    ("dinov3_model", "dinov3_grid_transposed", lambda c: c["height"] != c["width"]),
], ids=["registers-as-patches", "grid-transposed"])
def test_wrong_candidates_fail_exactly_where_expected(task_name, tree, failing):
    assert_fails_exactly(task_name, tree, failing)
