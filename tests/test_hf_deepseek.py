"""Our DeepseekV2ForCausalLM reproduces HF transformers (tiny random configs, CPU), calibrated as
tests/test_hf_llama.py: our float32 error against HF float64 stays within 2x HF float32's own.

Three layers, layer 0 dense (``first_k_dense_replace=1``, as the real models), YaRN rope with
mscale (the softmax scale correction), ``routed_scaling_factor`` != 1; q projected directly
(V2-Lite) and through the q LoRA (V2). A packed prefill of variable-length prompts, chunked
prefill reading the paged latent cache, and token-by-token decode through it (the drivers of
tests/test_hf_llama.py). Hub-style per-expert checkpoints load as transformers 5's fused experts.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.deepseek_v2.modeling_deepseek_v2")

from kernels_reference.L4.llama import model_for  # noqa: E402

import test_hf_llama as llama_checks  # noqa: E402
from test_hf_moe import _hub_style, eager_experts  # noqa: E402

YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32,
        "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
              moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2,
              routed_scaling_factor=2.5, topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
              first_k_dense_replace=1, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-6,
              attention_bias=False, tie_word_embeddings=False)
VARIANTS = {"v2-lite": None, "q-lora": 24}  # q_lora_rank


def _hf_and_ours(variant):
    torch.manual_seed(0)
    config = eager_experts(transformers.DeepseekV2Config(**COMMON, q_lora_rank=VARIANTS[variant],
                                                         rope_scaling=dict(YARN)))
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # HF initialises norms to ones and routers to zeros: randomise them all
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = model_for(config).eval()
    ours.load_weights(hf.state_dict().items())
    return hf, ours


@pytest.fixture(autouse=True)
def _same_builder(monkeypatch):
    """Reuse test_hf_llama's packed / chunked / decode drivers with the DeepSeek configs."""
    monkeypatch.setattr(llama_checks, "_hf_and_ours", _hf_and_ours)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_model_class_layers_and_latent_cache(variant):
    _, ours = _hf_and_ours(variant)
    assert type(ours).__name__ == "DeepseekV2ForCausalLM"
    assert [type(layer.mlp).__name__ for layer in ours.model.layers] == ["LlamaMLP", "DeepseekV2MoE", "DeepseekV2MoE"]
    assert hasattr(ours.model.layers[0].self_attn, "q_proj" if VARIANTS[variant] is None else "q_a_proj")
    ours.allocate_kv_cache(num_blocks=5, block_size=4)
    assert all(layer.self_attn.mla_attn.kv_cache.shape == (5, 4, 32 + 8) for layer in ours.model.layers)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_packed_prefill_of_variable_length_prompts(variant):
    llama_checks.test_packed_prefill_of_variable_length_prompts(variant)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_chunked_prefill_then_token_by_token_decode_through_the_paged_cache(variant):
    llama_checks.test_chunked_prefill_then_token_by_token_decode_through_the_paged_cache(variant)


def test_hub_per_expert_checkpoint_loads_as_the_fused_one():
    hf, ours = _hf_and_ours("v2-lite")
    hub = _hub_style(hf.state_dict(), "qwen3_moe")  # DeepSeek's Hub names are Qwen3-MoE's
    assert any(".experts.0.gate_proj." in k for k in hub)
    fresh = type(ours)(ours.config)
    fresh.load_weights(hub.items())
    mine, theirs = fresh.state_dict(), ours.state_dict()
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.equal(mine[name], theirs[name]), name
    hub.pop("model.layers.1.self_attn.kv_b_proj.weight")
    with pytest.raises(KeyError, match="kv_b_proj"):
        type(ours)(ours.config).load_weights(hub.items())
