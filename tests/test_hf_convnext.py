"""Our ConvNeXt-V2 block and model equal Hugging Face's ``ConvNextV2Layer`` / ``ConvNextV2Model`` in
float64 on a tiny ``ConvNextV2Config``, their weights loaded through the mappings in
kernels_reference (the bare model's keys and a ``ConvNextV2ForImageClassification`` checkpoint's),
on NCHW and channels-last inputs and a non-square image whose sides do not halve evenly; timm's
``ConvNeXt`` (ConvNeXt-V2 settings) likewise where timm is installed (the GPU machine). The largest
differences seen are printed with ``-s``."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.convnextv2.modeling_convnextv2")

from kernels_reference.L3.convnext_block import ConvNeXtBlock, hf_layer_state_dict  # noqa: E402
from kernels_reference.L4.convnext import ConvNextV2Model, hf_state_dict, timm_state_dict  # noqa: E402

DIMS, DEPTHS = [8, 16, 24, 32], [1, 1, 2, 1]
# 70 x 54 px: a 17 x 13 map after the stem (2 pixel rows past the last patch), then 8 x 6, 4 x 3, 2 x 1
IMAGE = (70, 54)


def _config(**overrides):
    # layer_norm_eps left at HF's default (1e-12, as in the published configs): only the head reads it
    return transformers.ConvNextV2Config(hidden_sizes=DIMS, depths=DEPTHS, num_stages=4, **overrides)


def _randomised(module, seed):
    """Every parameter drawn afresh (HF's init leaves norms at one and GRN at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            fan_in = p[0].numel() if p.dim() >= 2 else 0
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (fan_in ** -0.5 if fan_in else 0.5))
    return module


def _max_diff(got, want):
    return float((got - want).abs().max())


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
def test_block_equals_hf_layer_in_float64(layout):
    hf = _randomised(modeling.ConvNextV2Layer(_config(), dim=16).double().eval(), 1)
    ours = ConvNeXtBlock(16).double()
    ours.load_state_dict(hf_layer_state_dict(hf.state_dict()), strict=True)
    x = torch.randn(2, 16, 9, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        want = hf(x)
        if layout == "channels-last":
            x = x.contiguous(memory_format=torch.channels_last)
        got = ours.forward_native(x)
    print(f"block ({layout}): max |ours - HF| {_max_diff(got, want):.2e}")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert got.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("keys", ["model", "classification-checkpoint"])
def test_model_equals_hf_in_float64(keys):
    hf = _randomised(modeling.ConvNextV2Model(_config()).double().eval(), 3)
    state = hf.state_dict()
    if keys == "classification-checkpoint":  # the model under convnextv2., the classifier beside it
        state = {"convnextv2." + k: v for k, v in state.items()}
        state["classifier.weight"] = torch.zeros(10, DIMS[-1], dtype=torch.float64)
    ours = ConvNextV2Model(_config()).double()
    ours.load_state_dict(hf_state_dict(state, DEPTHS), strict=True)
    assert ours.head_norm.eps == 1e-12
    pixels = torch.randn(2, 3, *IMAGE, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        want = hf(pixel_values=pixels)
        last, pooled = ours.forward_native(pixels)
    assert last.shape == want.last_hidden_state.shape == (2, DIMS[-1], 2, 1)
    print(f"model ({keys}): max |ours - HF| last_hidden_state {_max_diff(last, want.last_hidden_state):.2e}, "
          f"pooler_output {_max_diff(pooled, want.pooler_output):.2e}")
    torch.testing.assert_close(last, want.last_hidden_state, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pooled, want.pooler_output, rtol=1e-10, atol=1e-10)


def test_model_equals_timm_in_float64():
    """timm's ConvNeXt with ConvNeXt-V2's settings (GRN, no LayerScale, Linear MLP): features and
    the pooled, normalised head input (``forward_head(pre_logits=True)``) from its state dict."""
    convnext = pytest.importorskip("timm.models.convnext")
    timm_model = convnext.ConvNeXt(depths=DEPTHS, dims=DIMS, use_grn=True, ls_init_value=None, num_classes=0)
    timm_model = _randomised(timm_model.double().eval(), 5)
    ours = ConvNextV2Model(dict(hidden_sizes=DIMS, depths=DEPTHS, layer_norm_eps=1e-6)).double()
    ours.load_state_dict(timm_state_dict(timm_model.state_dict(), DEPTHS), strict=True)
    pixels = torch.randn(2, 3, *IMAGE, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with torch.no_grad():
        features = timm_model.forward_features(pixels)
        pooled = timm_model.forward_head(features, pre_logits=True)
        last, ours_pooled = ours.forward_native(pixels)
    torch.testing.assert_close(last, features, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours_pooled, pooled, rtol=1e-10, atol=1e-10)
