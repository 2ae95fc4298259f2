"""Our MoE models reproduce HF transformers (tiny random configs, CPU), calibrated as
tests/test_hf_llama.py: our float32 error against HF float64 stays within 2x HF float32's own.

Mixtral and Qwen3-MoE (one sparse and one dense layer, ``mlp_only_layers``) as whole models: a
packed prefill, and chunked prefill then decode through the paged cache. DeepSeek-V2's MoE block
alone against HF's module (routed_scaling_factor != 1, so where it applies matters). Hub-style
per-expert checkpoints load exactly as transformers 5's fused 3-D experts do.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernels_reference.checkpoint import load_checkpoint  # noqa: E402
from kernels_reference.L2.deepseek_v2_moe import DeepseekV2MoE  # noqa: E402
from kernels_reference.L4.llama import model_for  # noqa: E402
from kernels_reference.model_config import DeepseekMoEConfig  # noqa: E402

import test_hf_llama as llama_checks  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
CONFIGS = {
    "mixtral": lambda: transformers.MixtralConfig(**COMMON, num_local_experts=6, num_experts_per_tok=2,
                                                  rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**COMMON, head_dim=32, num_experts=8, num_experts_per_tok=3,
                                                     moe_intermediate_size=32, norm_topk_prob=True,
                                                     decoder_sparse_step=1, mlp_only_layers=[1],
                                                     rms_norm_eps=1e-6, rope_theta=1e6),
}


def eager_experts(config):
    """HF's plain expert loop: its default grouped-GEMM path has no float64 (the truth runs in it)."""
    config._experts_implementation = "eager"
    return config


def _hf_and_ours(arch):
    torch.manual_seed(0)
    config = eager_experts(CONFIGS[arch]())
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # HF initialises norms to ones and routers to zeros: randomise them all
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = model_for(config).eval()
    ours.load_weights(hf.state_dict().items())
    return hf, ours


@pytest.fixture(autouse=True)
def _same_builder(monkeypatch):
    """Reuse test_hf_llama's packed / chunked / decode drivers with the MoE configs."""
    monkeypatch.setattr(llama_checks, "_hf_and_ours", _hf_and_ours)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_model_class_and_layers(arch):
    _, ours = _hf_and_ours(arch)
    assert type(ours).__name__ == {"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[arch]
    kinds = [type(getattr(layer, "block_sparse_moe", None) or layer.mlp).__name__ for layer in ours.model.layers]
    assert kinds == {"mixtral": ["MixtralMoE"] * 2, "qwen3_moe": ["Qwen3MoeSparseMoeBlock", "LlamaMLP"]}[arch]


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_packed_prefill_of_variable_length_prompts(arch):
    llama_checks.test_packed_prefill_of_variable_length_prompts(arch)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_chunked_prefill_then_token_by_token_decode_through_the_paged_cache(arch):
    llama_checks.test_chunked_prefill_then_token_by_token_decode_through_the_paged_cache(arch)


def _hub_style(state, arch):
    """transformers 5's fused experts split back into the per-expert names Hub checkpoints use."""
    names = {"mixtral": ("w1", "w3", "w2"), "qwen3_moe": ("gate_proj", "up_proj", "down_proj")}[arch]
    out = {}
    for key, value in state.items():
        if key.endswith(".experts.gate_up_proj"):
            prefix, half = key[: -len("gate_up_proj")], value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{prefix}{e}.{names[0]}.weight"] = value[e, :half].clone()
                out[f"{prefix}{e}.{names[1]}.weight"] = value[e, half:].clone()
        elif key.endswith(".experts.down_proj"):
            prefix = key[: -len("down_proj")]
            for e in range(value.shape[0]):
                out[f"{prefix}{e}.{names[2]}.weight"] = value[e].clone()
        else:
            out[key] = value
    if arch == "mixtral":  # the Hub's Mixtral names the block block_sparse_moe
        out = {k.replace(".mlp.", ".block_sparse_moe."): v for k, v in out.items()}
    return out


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_hub_per_expert_checkpoint_loads_as_the_fused_one(arch):
    hf, ours = _hf_and_ours(arch)
    hub = _hub_style(hf.state_dict(), arch)
    assert any(".experts.0." in k for k in hub) and not any(k.endswith("experts.down_proj") for k in hub)
    fresh = type(ours)(ours.config)
    fresh.load_weights(hub.items())
    mine, theirs = fresh.state_dict(), ours.state_dict()
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.equal(mine[name], theirs[name]), name
    # one expert's up projection missing: refused by name
    hub.pop(next(k for k in hub if k.endswith(".experts.1." + ("w3" if arch == "mixtral" else "up_proj") + ".weight")))
    with pytest.raises(KeyError, match="w13_weight"):
        type(ours)(ours.config).load_weights(hub.items())


def _deepseek_config(**overrides):
    values = dict(hidden_size=48, intermediate_size=80, moe_intermediate_size=24, n_routed_experts=8,
                  num_experts_per_tok=3, n_shared_experts=2, routed_scaling_factor=2.5, topk_method="greedy",
                  n_group=1, topk_group=1, norm_topk_prob=False, num_hidden_layers=2, first_k_dense_replace=1,
                  num_attention_heads=4, vocab_size=64)
    values.update(overrides)
    return transformers.DeepseekV2Config(**values)


def test_deepseek_v2_moe_block_matches_hf():
    torch.manual_seed(1)
    config = eager_experts(_deepseek_config())
    module_cls = getattr(transformers.models.deepseek_v2.modeling_deepseek_v2, "DeepseekV2Moe", None) or \
        transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2MoE
    hf = module_cls(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
    ours = DeepseekV2MoE(**DeepseekMoEConfig.from_hf(config).block_args()).eval()
    load_checkpoint(ours, hf.state_dict().items())
    x = torch.randn(19, config.hidden_size)
    with torch.no_grad():
        hf64 = module_cls(config).double().eval()
        hf64.load_state_dict(hf.state_dict())
        truth = hf64(x.double()[None])[0]
        hf32 = hf(x[None])[0].double()
        mine = ours(x).double()
        native64 = ours.double().forward_native(x.double())
    e_hf = float((hf32 - truth).norm() / truth.norm())
    e_ours = float((mine - truth).norm() / truth.norm())
    assert e_ours <= 2 * max(e_hf, 1e-6), (e_ours, e_hf)
    # The same math: only HF's router, which stays float32 inside a float64 model, separates them.
    assert float((native64 - truth).norm() / truth.norm()) < 1e-6


def test_deepseek_config_refuses_other_routing_by_name():
    assert DeepseekMoEConfig.from_hf(_deepseek_config()).is_sparse_layer(1)
    assert not DeepseekMoEConfig.from_hf(_deepseek_config()).is_sparse_layer(0)
    with pytest.raises(NotImplementedError, match="group_limited_greedy"):
        DeepseekMoEConfig.from_hf({"topk_method": "group_limited_greedy", "hidden_size": 8})
