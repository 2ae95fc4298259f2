"""The architecture facts a Llama-family model needs, read from an HF config (object or dict).

Llama, Mistral, Qwen2 and Qwen3 differ only by switches here: qkv bias (Qwen2, or Llama's
``attention_bias``), per-head q/k norm (Qwen3), an explicit head_dim, rope scaling, tied embeddings.
A new HF decoder architecture of the same shape is added by mapping its config onto these fields.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}
QKV_BIAS = {"Qwen2ForCausalLM"}
QK_NORM = {"Qwen3ForCausalLM"}


@dataclasses.dataclass(frozen=True)
class LlamaArchConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: Optional[dict] = None
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    architecture: str = "LlamaForCausalLM"

    @staticmethod
    def from_hf(config: Any) -> "LlamaArchConfig":
        get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else \
            (lambda k, d=None: getattr(config, k, d))
        arch = (get("architectures") or [MODEL_TYPES.get(get("model_type"), "LlamaForCausalLM")])[0]
        heads = get("num_attention_heads")
        rope = dict(get("rope_parameters") or {})  # transformers 5 keeps theta and scaling here
        theta = get("rope_theta") or rope.get("rope_theta") or 10000.0
        scaling = get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling:
            scaling = {k: v for k, v in dict(scaling).items() if k != "rope_theta"}
        return LlamaArchConfig(
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"), num_hidden_layers=get("num_hidden_layers"),
            num_attention_heads=heads, num_key_value_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads, rms_norm_eps=get("rms_norm_eps"),
            rope_theta=float(theta), max_position_embeddings=get("max_position_embeddings"),
            rope_scaling=scaling or None,
            qkv_bias=arch in QKV_BIAS or bool(get("attention_bias", False)),
            qk_norm=arch in QK_NORM or bool(get("qk_norm", False)),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            hidden_act=get("hidden_act", "silu"), architecture=arch)
