"""Qwen3-Next's modules against HF transformers' (same weights, same inputs)."""
import pytest
import torch

from kernels_reference.L1.gemma_rms_norm import GemmaRMSNorm

modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rms_norm_is_hf_qwen3_next_rms_norm(dtype):
    gen = torch.Generator().manual_seed(0)
    ours, hf = GemmaRMSNorm(256, eps=1e-6), modeling.Qwen3NextRMSNorm(256, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(0.2 * torch.randn(256, generator=gen))
    ours.load_state_dict(hf.state_dict())  # the checkpoint's zero-centred weight, as stored
    ours, hf = ours.to(dtype), hf.to(dtype)
    x = torch.randn(5, 3, 256, generator=gen).to(dtype)
    torch.testing.assert_close(ours.forward_native(x), hf(x), rtol=0, atol=0)


def test_gated_attention_block_is_hf_qwen3_next_attention():
    """Prefill of one prompt and then a decode step through the paged cache: our block's native
    path in float32 against HF's ``Qwen3NextAttention`` on the same checkpoint tensors."""
    from kernels_reference.forward_context import AttentionMetadata, set_forward_context
    from kernels_reference.L2.qwen3_next_attention import Qwen3NextAttention

    cfg = modeling.Qwen3NextConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   partial_rotary_factor=0.25, rope_theta=1e6, max_position_embeddings=512,
                                   rms_norm_eps=1e-6, num_hidden_layers=1, layer_types=["full_attention"])
    cfg._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(0)
    hf = modeling.Qwen3NextAttention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen) if p.dim() == 1 else
                    torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    ours = Qwen3NextAttention(256, 4, 2, 64, 512, 1e6, 0.25, 1e-6).eval()
    sd = hf.state_dict()
    ours.load_state_dict({"qkv_proj.weight": torch.cat([sd["q_proj.weight"], sd["k_proj.weight"], sd["v_proj.weight"]]),
                          "o_proj.weight": sd["o_proj.weight"], "q_norm.weight": sd["q_norm.weight"],
                          "k_norm.weight": sd["k_norm.weight"]})
    t = 11
    x = torch.randn(1, t, 256, generator=gen)
    positions = torch.arange(t)[None]
    cos, sin = modeling.Qwen3NextRotaryEmbedding(cfg)(x, positions)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected = hf(x, position_embeddings=(cos, sin), attention_mask=mask)[0][0]
        block = 16
        cache = (torch.zeros(4, block, 2, 64), torch.zeros(4, block, 2, 64))
        ours.attn.kv_cache = cache
        # The first t - 1 tokens as a prefill, the last as a decode step reading them from the cache.
        with set_forward_context(AttentionMetadata.build([0], [t - 1], block, block_tables=[[2]])):
            first = ours.forward_native(positions[0, :-1], x[0, :-1])
        with set_forward_context(AttentionMetadata.build([t - 1], [1], block, block_tables=[[2]])):
            last = ours.forward_native(positions[0, -1:], x[0, -1:])
    torch.testing.assert_close(torch.cat([first, last]), expected, rtol=1e-4, atol=1e-5)
