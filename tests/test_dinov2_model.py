"""DINOv2's image encoder (L4): the model refuses images it cannot read, equals Hugging Face's
``Dinov2Model`` in float64 (native grid, resampled grids, non-square) with its weights loaded by
checkpoint name, and the task's verdicts on the honest example tree and on wrong candidates, each
failing exactly on the cases that can see its bug. The trained DINOv2-S/14 against Hugging Face on
real photographs is tests/test_dinov2_trained.py."""
import pytest
import torch

from fk_pytest.registry import get_task
from kernels_reference.L4.dinov2 import Dinov2Model

from conftest import EXAMPLES
from test_verdicts import assert_fails_exactly, assert_passes_every_case

TINY = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=2, mlp_ratio=4, image_size=70, patch_size=14,
            layer_norm_eps=1e-6, hidden_act="gelu", layerscale_value=1.0)


@pytest.mark.parametrize("shape, message", [
    ((3, 70, 70), r"Dinov2Model expects pixel_values \[B, 3, H, W\]; got a 3-D tensor"),
    ((1, 1, 70, 70), r"Dinov2Model takes 3-channel images; got 1 channels"),
    ((1, 3, 70, 71), r"Dinov2Model: a 70x71 image is not a whole number of 14x14 patches"),
], ids=["3-d", "grey", "not-whole-patches"])
def test_model_refuses_images_it_cannot_read(shape, message):
    with pytest.raises(ValueError, match=message):
        Dinov2Model(TINY)(torch.zeros(shape))


def test_model_takes_any_whole_patch_grid():
    model = Dinov2Model(TINY)
    assert model(torch.zeros(2, 3, 42, 98)).shape == (2, 1 + 3 * 7, 32)


def _hf_model(seed):
    """HF's model with every parameter drawn afresh (its init leaves norms at one, biases at zero and
    every LayerScale gain at ``layerscale_value``)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.Dinov2Model(transformers.Dinov2Config(**TINY, attn_implementation="sdpa")).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (p.shape[-1] ** -0.5 if p.dim() >= 2 else 0.5))
    return hf


@pytest.mark.parametrize("height, width", [(70, 70), (42, 42), (56, 98)], ids=["native", "smaller", "non-square"])
def test_model_equals_hf_in_float64(height, width):
    """Loaded through ``load_weights`` from HF's own names. Off the native grid HF resamples the
    table in float32 even in a float64 model: agreement to float32's precision there."""
    hf = _hf_model(5)
    ours = Dinov2Model(TINY).double()
    ours.load_weights(hf.state_dict().items())
    pixels = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with torch.no_grad():
        want = hf(pixel_values=pixels)
        got = ours.forward_native(pixels)
    tol = 1e-10 if (height, width) == (70, 70) else 1e-6
    assert got.shape == want.last_hidden_state.shape == (2, 1 + (height // 14) * (width // 14), 32)
    torch.testing.assert_close(got, want.last_hidden_state, rtol=tol, atol=tol)
    torch.testing.assert_close(Dinov2Model.pooler_output(got), want.pooler_output, rtol=tol, atol=tol)


def test_load_weights_names_what_does_not_fit():
    state = dict(_hf_model(7).state_dict())
    with pytest.raises(KeyError, match="no place in the model.*encoder.layer.2.norm1.weight"):
        Dinov2Model(TINY).load_weights(list(state.items()) + [("encoder.layer.2.norm1.weight", torch.ones(32))])
    del state["encoder.layer.1.mlp.fc2.bias"]
    with pytest.raises(KeyError, match="encoder.layer.1.mlp.fc2.bias"):
        Dinov2Model(TINY).load_weights(state.items())


def test_honest_example_candidate_passes_every_case():
    assert_passes_every_case("dinov2_model", EXAMPLES)


def _resampled(case):
    return (case["height"], case["width"]) != (case["image_size"],) * 2


@pytest.mark.parametrize("tree, failing", [
    ("dinov2_no_final_layernorm", lambda c: True),
    ("dinov2_last_layer_no_layerscale", lambda c: True),
    # at the native grid the first 1 + h * w rows are the whole table: right there, wrong elsewhere
    ("dinov2_position_rows_truncated", _resampled),
], ids=["no-final-layernorm", "last-layer-no-layerscale", "position-rows-truncated"])
def test_wrong_candidates_fail_exactly_where_expected(tree, failing):
    assert_fails_exactly("dinov2_model", tree, failing, some_pass=tree == "dinov2_position_rows_truncated")


def test_cpu_cases_hold_a_native_and_a_resampled_grid():
    """What the position-table bug needs to be seen (and its pass on the native grid to mean something)."""
    cases = get_task("dinov2_model").cases("cpu")
    assert {_resampled(c) for c in cases} == {True, False}
