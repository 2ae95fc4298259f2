"""Our DINOv3 modules against Hugging Face's ``dinov3_vit``: the 2-D rotary embedding's float32 cos/sin
equal to the bit for DINOv3's head sizes and its rotation equal in float64; ``DINOv3ViTLayer`` (plain
MLP without a key bias as ViT-L has it, and the gated SiLU MLP with every bias) and
``DINOv3ViTModel`` (square, non-square and part-patch images, either MLP, weights loaded by HF's names)
equal in float64 on tiny configs: to 1e-10 where HF is handed the module's float64 cos/sin, to
float32's precision where it computes its own (in float32, whatever the model's dtype)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.dinov3_vit.modeling_dinov3_vit")

from kernels_reference.L1.rope_2d import DINOv3ViTRopePositionEmbedding  # noqa: E402
from kernels_reference.L3.dinov3_layer import DINOv3ViTLayer, hf_layer_state_dict  # noqa: E402
from kernels_reference.L4.dinov3 import DINOv3ViTModel  # noqa: E402

HIDDEN, HEADS, REGISTERS, PATCH = 128, 2, 4, 16  # heads of DINOv3's 64
MLPS = {"plain": dict(), "gated": dict(use_gated_mlp=True, hidden_act="silu", key_bias=True)}


def _config(mlp="plain", **kw):
    return transformers.DINOv3ViTConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
                                        num_register_tokens=REGISTERS, patch_size=PATCH, **MLPS[mlp], **kw)


def _randomised(module, seed):
    """Every parameter drawn afresh (HF's init leaves norms at one, biases at zero and LayerScale constant)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (p.shape[-1] ** -0.5 if p.dim() >= 2 else 0.5))
    return module


@pytest.mark.parametrize("head_size", [64, 128], ids=["vit-l", "vit-7b"])
@pytest.mark.parametrize("grid", [(14, 14), (30, 40), (3, 7), (1, 1)], ids=["224px", "photo", "tall", "one"])
def test_cos_sin_equal_hf_in_float32(head_size, grid):
    """The same float32 operations as HF's coordinates, frequencies and angles: the same bits
    (HF tiles the [N, d/2] angles twice; the module keeps one copy)."""
    config = transformers.DINOv3ViTConfig(hidden_size=head_size, num_attention_heads=1, patch_size=PATCH)
    image = torch.zeros(1, 3, grid[0] * PATCH, grid[1] * PATCH)
    cos, sin = modeling.DINOv3ViTRopePositionEmbedding(config).eval()(image)
    ours_cos, ours_sin = DINOv3ViTRopePositionEmbedding(head_size, 100.0).cos_sin(*grid, torch.float32)
    assert torch.equal(cos, ours_cos.tile(2)) and torch.equal(sin, ours_sin.tile(2))


@pytest.mark.parametrize("grid", [(3, 5), (4, 4)], ids=["non-square", "square"])
def test_rotation_equals_hf_in_float64(grid):
    """``apply_rotary_pos_emb`` on HF's [B, heads, S, d] layout with the module's float64 cos/sin:
    prefix rows untouched, patch rows rotated alike."""
    rope = DINOv3ViTRopePositionEmbedding(64, 100.0, 1 + REGISTERS)
    gen = torch.Generator().manual_seed(sum(grid))
    tokens = 1 + REGISTERS + grid[0] * grid[1]
    q, k = (torch.randn(2, 3, tokens, 64, generator=gen, dtype=torch.float64) for _ in range(2))
    cos, sin = rope.cos_sin(*grid, torch.float64)
    want_q, want_k = modeling.apply_rotary_pos_emb(q, k, cos.tile(2), sin.tile(2))
    got_q, got_k = rope.forward_native(q.transpose(1, 2), k.transpose(1, 2).flatten(2), *grid)
    torch.testing.assert_close(got_q.transpose(1, 2), want_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_k.unflatten(-1, (3, 64)).transpose(1, 2), want_k, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mlp", list(MLPS))
def test_layer_equals_hf_in_float64(mlp):
    """HF's layer fed the module's float64 cos/sin (HF's own are float32 for every dtype; their
    agreement is the test above), loaded through ``hf_layer_state_dict``."""
    config = _config(mlp, attn_implementation="eager")
    hf = _randomised(modeling.DINOv3ViTLayer(config).double().eval(), 3)
    ours = DINOv3ViTLayer(config).double()
    ours.load_state_dict(hf_layer_state_dict(hf.state_dict()), strict=True)
    grid = (3, 2)
    x = torch.randn(2, 1 + REGISTERS + 6, HIDDEN, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    cos, sin = ours.attention.rotary_emb.cos_sin(*grid, torch.float64)
    with torch.no_grad():
        want = hf(x, position_embeddings=(cos.tile(2), sin.tile(2)))
        got = ours.forward_native(x, *grid)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("height, width, mlp", [
    (64, 64, "plain"), (48, 80, "plain"), (50, 37, "plain"), (48, 80, "gated"),
], ids=["square", "non-square", "part-patch", "gated"])
def test_model_equals_hf_in_float64(height, width, mlp):
    """Loaded through ``load_weights`` from HF's own names (its mask token left out). HF's angles are
    float32 even in a float64 model: agreement to float32's precision."""
    config = _config(mlp, num_hidden_layers=2)
    hf = _randomised(transformers.DINOv3ViTModel(config).double().eval(), 5)
    ours = DINOv3ViTModel(config).double()
    ours.load_weights(hf.state_dict().items())
    pixels = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with torch.no_grad():
        want = hf(pixel_values=pixels)
        got = ours.forward_native(pixels)
    tokens = 1 + REGISTERS + (height // PATCH) * (width // PATCH)
    assert got.shape == want.last_hidden_state.shape == (2, tokens, HIDDEN)
    torch.testing.assert_close(got, want.last_hidden_state, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(DINOv3ViTModel.pooler_output(got), want.pooler_output, rtol=1e-6, atol=1e-6)


def test_load_weights_refuses_a_tensor_with_no_place():
    hf = transformers.DINOv3ViTModel(_config(num_hidden_layers=1))
    state = dict(hf.state_dict(), **{"model.layer.1.norm1.weight": torch.ones(HIDDEN)})
    with pytest.raises(KeyError, match=r"no place in the model: \['model.layer.1.norm1.weight'\]"):
        DINOv3ViTModel(_config(num_hidden_layers=1)).load_weights(state.items())
