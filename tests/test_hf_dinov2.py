"""Our DINOv2 modules equal Hugging Face's on a tiny ``Dinov2Config`` in float64, their weights loaded
through the mappings in kernels_reference: ``Dinov2Embeddings`` as ``PatchEmbed`` followed by
``Dinov2PositionEmbedding`` (native grid, smaller, larger and non-square images), and
``Dinov2Layer`` (from transformers' own state dict and from the checkpoints' older key spelling)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.dinov2.modeling_dinov2")

from kernels_reference.L1.dinov2_embeddings import Dinov2PositionEmbedding, hf_embeddings_state_dict  # noqa: E402
from kernels_reference.L1.patch_embed import PatchEmbed  # noqa: E402
from kernels_reference.L3.dinov2_layer import Dinov2Layer, hf_layer_state_dict  # noqa: E402

HIDDEN, HEADS, PATCH, NATIVE_SIZE = 32, 4, 14, 5 * 14  # a 5 x 5 native grid


def _config():
    return transformers.Dinov2Config(hidden_size=HIDDEN, num_attention_heads=HEADS, num_hidden_layers=1,
                                     mlp_ratio=4, image_size=NATIVE_SIZE, patch_size=PATCH, layer_norm_eps=1e-6,
                                     hidden_act="gelu", layerscale_value=1.0)


def _randomised(module, seed):
    """Every parameter drawn afresh (HF's init leaves norms at one, biases and LayerScale constant)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (p.shape[-1] ** -0.5 if p.dim() == 2 else 0.5))
    return module


@pytest.mark.parametrize("height, width", [(70, 70), (42, 42), (56, 98), (100, 84)],
                         ids=["native", "smaller", "non-square", "larger"])
def test_embeddings_equal_hf(height, width):
    """HF resamples the table in float32 even for a float64 model: agreement to float32's precision."""
    hf = _randomised(modeling.Dinov2Embeddings(_config()).double().eval(), 1)
    hf_state = {f"embeddings.{k}": v for k, v in hf.state_dict().items()}
    patches = PatchEmbed(img_size=NATIVE_SIZE, patch_size=PATCH, in_chans=3, embed_dim=HIDDEN).double()
    patches.load_state_dict({"proj." + k.rpartition(".")[2]: hf_state[k] for k in
                             ("embeddings.patch_embeddings.projection.weight",
                              "embeddings.patch_embeddings.projection.bias")})
    ours = Dinov2PositionEmbedding(HIDDEN, image_size=NATIVE_SIZE, patch_size=PATCH).double()
    ours.load_state_dict(hf_embeddings_state_dict(hf_state))
    pixels = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        want = hf(pixels)
        got = ours.forward_native(patches.forward_native(pixels), height // PATCH, width // PATCH)
    assert got.shape == want.shape == (2, 1 + (height // PATCH) * (width // PATCH), HIDDEN)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def _checkpoint_spelling(state):
    """transformers 5's layer keys written as the published checkpoints spell them."""
    renames = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
               "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense"}
    out = {}
    for key, value in state.items():
        for new, old in renames.items():
            if key.startswith(new + "."):
                key = old + key[len(new):]
        out["encoder.layer.0." + key] = value
    return out


@pytest.mark.parametrize("spelling", ["transformers", "checkpoint"])
def test_layer_equals_hf_in_float64(spelling):
    hf = _randomised(modeling.Dinov2Layer(_config()).double().eval(), 3)
    state, prefix = hf.state_dict(), ""
    if spelling == "checkpoint":
        state, prefix = _checkpoint_spelling(state), "encoder.layer.0."
    ours = Dinov2Layer(HIDDEN, HEADS, mlp_ratio=4, layer_norm_eps=1e-6).double()
    ours.load_state_dict(hf_layer_state_dict(state, prefix), strict=True)
    x = torch.randn(3, 1 + 4 * 3, HIDDEN, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        want = hf(x)
        want = want[0] if isinstance(want, tuple) else want
        got = ours.forward_native(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
