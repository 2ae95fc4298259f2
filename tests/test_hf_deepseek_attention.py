"""Our DeepseekV2MLAAttention reproduces HF transformers' DeepseekV2Attention (tiny random config).

The same weights (loaded through HF's ``self_attn.*`` names) give the same attention-block outputs
for (a) a packed batch of variable-length prompts, (b) chunked prefill reading the first chunk from
the paged latent cache and (c) token-by-token decode through it. Positions start past YaRN's
original context so the scaled frequencies and the mscale-corrected softmax scale both matter.
Calibrated as tests/test_hf_llama.py: our float32 error against HF in float64 must stay within 2x
HF float32's own error (1e-6 floor). The cache tests run our native path and the fast path (the
Triton store, absorbed decode and rope kernels, interpreted on the CPU).
"""
import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: kernels run on the CPU
transformers = pytest.importorskip("transformers")
hf_deepseek = pytest.importorskip("transformers.models.deepseek_v2.modeling_deepseek_v2")

from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402
from kernels_reference.L2.deepseek_v2_attention import DeepseekV2MLAAttention  # noqa: E402

BLOCK = 4
OFFSET = 40  # first position: past the original context (32) that YaRN extends
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32,
        "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
# mscale != mscale_all_dim: YaRN's cos/sin carry a factor (1.0347 here) as well as the softmax scale
YARN_UNEVEN = dict(YARN, mscale=1.0, mscale_all_dim=0.5)
SHAPES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
              qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=128,
              rope_theta=10000.0, rms_norm_eps=1e-6, attention_bias=False)
VARIANTS = {"yarn": (None, YARN), "yarn-uneven-mscale": (None, YARN_UNEVEN), "q-lora": (24, YARN)}


def _pair(variant):
    q_lora_rank, scaling = VARIANTS[variant]
    torch.manual_seed(0)
    config = transformers.DeepseekV2Config(**SHAPES, q_lora_rank=q_lora_rank, rope_scaling=dict(scaling))
    config._attn_implementation = "eager"
    hf = hf_deepseek.DeepseekV2Attention(config, layer_idx=0).eval()
    rope = hf_deepseek.DeepseekV2RotaryEmbedding(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5 if p.dim() == 2 else 1 + 0.2 * torch.randn_like(p))
    ours = DeepseekV2MLAAttention(
        hidden_size=SHAPES["hidden_size"], num_heads=SHAPES["num_attention_heads"],
        qk_nope_head_dim=SHAPES["qk_nope_head_dim"], qk_rope_head_dim=SHAPES["qk_rope_head_dim"],
        v_head_dim=SHAPES["v_head_dim"], q_lora_rank=q_lora_rank, kv_lora_rank=SHAPES["kv_lora_rank"],
        rope_theta=SHAPES["rope_theta"], rope_scaling=dict(scaling),
        max_position_embeddings=SHAPES["max_position_embeddings"], rms_norm_eps=SHAPES["rms_norm_eps"]).eval()
    state = {f"model.layers.0.self_attn.{k}": v for k, v in hf.state_dict().items()}
    ours.load_hf_weights(state.items(), prefix="model.layers.0.self_attn.")
    return hf, rope, ours


def _hf_out(hf, rope, x, dtype):
    """HF's block on one sequence [L, hidden] at positions OFFSET.., causal, in ``dtype``."""
    hf, rope = hf.to(dtype), rope.to(dtype)
    length = x.shape[0]
    mask = torch.full((length, length), float("-inf"), dtype=dtype).triu(1)[None, None]
    with torch.no_grad():
        freqs = rope(x[None].to(dtype), torch.arange(OFFSET, OFFSET + length)[None])
        out, _ = hf(x[None].to(dtype), attention_mask=mask, position_embeddings=freqs)
    return out[0].double()


def _check(ours, hf, rope, x):
    hf64, hf32 = _hf_out(hf, rope, x, torch.float64), _hf_out(hf, rope, x, torch.float32)
    e_ours = float((ours.double() - hf64).norm() / hf64.norm())
    e_hf = float((hf32 - hf64).norm() / hf64.norm())
    assert e_ours <= 2 * max(e_hf, 1e-6), (e_ours, e_hf)


def _use_fast_path(ours):
    """Run the children's CUDA paths on the CPU (interpreted): rope kernel, MLA store/decode/prefill."""
    ours.rotary_emb.forward = ours.rotary_emb.forward_triton
    ours.mla_attn.forward = ours.mla_attn.forward_fast


def _run(ours, x, meta):
    with torch.no_grad(), set_forward_context(meta):
        return ours(meta.positions() + OFFSET, x)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_packed_prefill_of_variable_length_prompts(variant):
    hf, rope, ours = _pair(variant)
    prompts = [torch.randn(n, SHAPES["hidden_size"]) for n in (5, 11, 1)]
    ours.mla_attn.kv_cache = torch.zeros(16, BLOCK, SHAPES["kv_lora_rank"] + SHAPES["qk_rope_head_dim"])
    meta = AttentionMetadata.build([0] * len(prompts), [len(p) for p in prompts], BLOCK)
    out = _run(ours, torch.cat(prompts), meta)
    start = 0
    for p in prompts:
        _check(out[start:start + len(p)], hf, rope, p)
        start += len(p)


@pytest.mark.parametrize("path", ["native", "fast"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_chunked_prefill_then_token_by_token_decode_through_the_latent_cache(variant, path):
    hf, rope, ours = _pair(variant)
    if path == "fast":
        _use_fast_path(ours)
    seqs = [torch.randn(n, SHAPES["hidden_size"]) for n in (9, 6)]
    ours.mla_attn.kv_cache = torch.randn(12, BLOCK, SHAPES["kv_lora_rank"] + SHAPES["qk_rope_head_dim"])
    tables = [[0, 2, 4, 6], [1, 3, 5, 7]]  # interleaved blocks, as a block manager hands them out
    rows = {0: [], 1: []}
    for ctx, q in (((0, 0), (3, 3)), ((3, 3), (3, 1))):  # the prompts (6 and 4) in two chunks
        meta = AttentionMetadata.build(list(ctx), list(q), BLOCK, block_tables=tables)
        out = _run(ours, torch.cat([seqs[0][ctx[0]:ctx[0] + q[0]], seqs[1][ctx[1]:ctx[1] + q[1]]]), meta)
        rows[0].append(out[:q[0]])
        rows[1].append(out[q[0]:])
    done = [6, 4]
    while any(done[i] < len(seqs[i]) for i in (0, 1)):  # decode, one token per live sequence
        live = [i for i in (0, 1) if done[i] < len(seqs[i])]
        meta = AttentionMetadata.build([done[i] for i in live], [1] * len(live), BLOCK,
                                       block_tables=[tables[i] for i in live])
        out = _run(ours, torch.cat([seqs[i][done[i]:done[i] + 1] for i in live]), meta)
        for j, i in enumerate(live):
            rows[i].append(out[j:j + 1])
            done[i] += 1
    for i in (0, 1):
        _check(torch.cat(rows[i]), hf, rope, seqs[i])


def test_softmax_scale_carries_yarn_mscale():
    _, _, ours = _pair("yarn")
    mscale = 0.1 * 0.707 * torch.log(torch.tensor(4.0)).item() + 1
    assert ours.mla_attn.scale == pytest.approx((16 + 8) ** -0.5 * mscale ** 2)


def test_weight_loading_refuses_a_missing_or_misshapen_weight():
    hf, _, ours = _pair("yarn")
    state = {f"self_attn.{k}": v for k, v in hf.state_dict().items()}
    partial = {k: v for k, v in state.items() if "kv_b_proj" not in k}
    with pytest.raises(KeyError, match="missing"):
        ours.load_hf_weights(partial.items(), prefix="self_attn.")
    state["self_attn.o_proj.weight"] = torch.ones(3, 3)
    with pytest.raises(ValueError, match="shape"):
        ours.load_hf_weights(state.items(), prefix="self_attn.")
