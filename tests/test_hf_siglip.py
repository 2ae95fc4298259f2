"""Our SigLIP modules equal Hugging Face's on a tiny ``SiglipVisionConfig`` in float64, their weights
loaded through the mappings in kernels_reference: ``SiglipEncoderLayer`` and the whole
``SiglipVisionModel`` (patch embedding, position table, layers, post_layernorm; HF's pooling head
left out, as ours has none), from the bare tower's keys and from a full checkpoint's
``vision_model.`` keys."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.siglip.modeling_siglip")

from kernels_reference.L3.siglip_encoder_layer import SiglipEncoderLayer, hf_layer_state_dict  # noqa: E402
from kernels_reference.L4.siglip import SiglipVisionModel, hf_state_dict  # noqa: E402

HIDDEN, HEADS, INTER, LAYERS, PATCH = 32, 4, 56, 2, 14
NATIVE_SIZE = 3 * PATCH + 6  # a 3 x 3 grid with pixels past the last patch, as 384 px at 14


def _config():
    # SDPA: HF's eager attention takes its softmax in float32 even in a float64 model
    return transformers.SiglipVisionConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=INTER,
                                           num_hidden_layers=LAYERS, image_size=NATIVE_SIZE, patch_size=PATCH,
                                           layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
                                           vision_use_head=False, attn_implementation="sdpa")


def _randomised(module, seed):
    """Every parameter drawn afresh (HF's init leaves norms at one and biases at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (p.shape[-1] ** -0.5 if p.dim() >= 2 else 0.5))
    return module


def test_layer_equals_hf_in_float64():
    hf = _randomised(modeling.SiglipEncoderLayer(_config()).double().eval(), 1)
    ours = SiglipEncoderLayer(HIDDEN, HEADS, INTER).double()
    ours.load_state_dict(hf_layer_state_dict(hf.state_dict()), strict=True)
    x = torch.randn(2, 9, HIDDEN, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        want = hf(x, attention_mask=None)
        want = want[0] if isinstance(want, tuple) else want
        got = ours.forward_native(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("keys", ["tower", "checkpoint"])
def test_vision_model_equals_hf_in_float64(keys):
    hf = _randomised(modeling.SiglipVisionModel(_config()).double().eval(), 3)
    state = hf.state_dict()
    if keys == "checkpoint":  # a SiglipModel checkpoint: the tower under vision_model., the text tower beside it
        state = {"vision_model." + k: v for k, v in state.items()}
        state["text_model.final_layer_norm.weight"] = torch.ones(HIDDEN, dtype=torch.float64)
    ours = SiglipVisionModel(_config()).double()
    ours.load_state_dict(hf_state_dict(state, LAYERS), strict=True)
    pixels = torch.randn(2, 3, NATIVE_SIZE, NATIVE_SIZE, generator=torch.Generator().manual_seed(4),
                         dtype=torch.float64)
    with torch.no_grad():
        want = hf(pixel_values=pixels).last_hidden_state
        got = ours.forward_native(pixels)
    assert got.shape == want.shape == (2, 9, HIDDEN)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)

