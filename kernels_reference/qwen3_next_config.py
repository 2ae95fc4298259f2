"""The architecture facts Qwen3-Next needs, read from an HF ``Qwen3NextConfig`` (object or dict).

A hybrid stack: ``layer_types[i]`` says whether layer i mixes tokens with the gated DeltaNet
(``linear_attention``, a recurrent state per sequence) or with gated full attention
(``full_attention``, a paged KV cache). Configs that do not list the types give
``full_attention_interval`` (4 in Qwen3-Next-80B-A3B: layers 3, 7, 11, ... attend), as HF derives
them. Every layer's MLP is the MoE block with a shared expert, except layers in ``mlp_only_layers``
or off the ``decoder_sparse_step`` grid, which get a dense MLP ``intermediate_size`` wide (HF's and
vLLM's rule; Qwen3-Next-80B-A3B has none).

The field names the engine and the tasks read for every model (vocab_size, hidden_size,
num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps,
max_position_embeddings, tie_word_embeddings, architecture) are Llama's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Tuple

from .model_config import _getter

LINEAR, FULL = "linear_attention", "full_attention"


def default_layer_types(layers: int, full_attention_interval: int = 4) -> Tuple[str, ...]:
    """Every ``full_attention_interval``-th layer attends (the last of each group), the rest are linear."""
    return tuple(FULL if (i + 1) % full_attention_interval == 0 else LINEAR for i in range(layers))


@dataclasses.dataclass(frozen=True)
class Qwen3NextArchConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: Tuple[str, ...]
    # gated full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    partial_rotary_factor: float
    rope_theta: float
    max_position_embeddings: int
    # gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # MoE with a shared expert
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: Tuple[int, ...] = ()
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    architecture: str = "Qwen3NextForCausalLM"

    def __post_init__(self):
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"{len(self.layer_types)} layer types for {self.num_hidden_layers} layers")
        unknown = set(self.layer_types) - {LINEAR, FULL}
        if unknown:
            raise ValueError(f"unknown layer types {sorted(unknown)}")

    def is_sparse_layer(self, layer_idx: int) -> bool:
        return (self.num_experts > 0 and layer_idx not in self.mlp_only_layers
                and (layer_idx + 1) % self.decoder_sparse_step == 0)

    def attention_args(self) -> dict:
        """The constructor arguments of ``L2.qwen3_next_attention.Qwen3NextAttention``."""
        return dict(hidden_size=self.hidden_size, num_heads=self.num_attention_heads,
                    num_kv_heads=self.num_key_value_heads, head_dim=self.head_dim,
                    max_position_embeddings=self.max_position_embeddings, rope_theta=self.rope_theta,
                    partial_rotary_factor=self.partial_rotary_factor, rms_norm_eps=self.rms_norm_eps,
                    attention_bias=self.attention_bias)

    def linear_attention_args(self) -> dict:
        """The constructor arguments of ``L2.qwen3_next_gated_delta_net.Qwen3NextGatedDeltaNet``."""
        return dict(hidden_size=self.hidden_size, num_k_heads=self.linear_num_key_heads,
                    num_v_heads=self.linear_num_value_heads, head_k_dim=self.linear_key_head_dim,
                    head_v_dim=self.linear_value_head_dim, conv_kernel_size=self.linear_conv_kernel_dim,
                    rms_norm_eps=self.rms_norm_eps)

    def moe_args(self) -> dict:
        """The constructor arguments of ``L2.qwen3_next_moe.Qwen3NextSparseMoeBlock``."""
        return dict(hidden_size=self.hidden_size, moe_intermediate_size=self.moe_intermediate_size,
                    num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                    norm_topk_prob=self.norm_topk_prob,
                    shared_expert_intermediate_size=self.shared_expert_intermediate_size)

    # ---- per-slot state sizes (what an engine allocates per sequence and linear layer) -------------
    @property
    def linear_conv_dim(self) -> int:  # q, k and v go through the short convolution together
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + \
            self.linear_num_value_heads * self.linear_value_head_dim

    def conv_state_shape(self) -> Tuple[int, int]:
        return (self.linear_conv_kernel_dim - 1, self.linear_conv_dim)

    def ssm_state_shape(self) -> Tuple[int, int, int]:
        return (self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim)

    @staticmethod
    def from_hf(config: Any) -> "Qwen3NextArchConfig":
        if isinstance(config, Qwen3NextArchConfig):
            return config
        get = _getter(config)
        # transformers 5 keeps theta and the partial factor in ``rope_parameters`` (also read as rope_scaling)
        rope = dict(get("rope_parameters") or get("rope_scaling") or {})
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise NotImplementedError(f"rope type {kind!r}: Qwen3-Next's attention takes plain RoPE")
        theta = float(get("rope_theta") or rope.get("rope_theta") or 10000.0)
        partial = float(get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 0.25)
        layers = get("num_hidden_layers")
        types = get("layer_types") or default_layer_types(layers, get("full_attention_interval", 4) or 4)
        heads = get("num_attention_heads")
        return Qwen3NextArchConfig(
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"), num_hidden_layers=layers, layer_types=tuple(types),
            num_attention_heads=heads, num_key_value_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads,
            partial_rotary_factor=partial, rope_theta=theta,
            max_position_embeddings=get("max_position_embeddings"),
            linear_num_key_heads=get("linear_num_key_heads"), linear_num_value_heads=get("linear_num_value_heads"),
            linear_key_head_dim=get("linear_key_head_dim"), linear_value_head_dim=get("linear_value_head_dim"),
            linear_conv_kernel_dim=get("linear_conv_kernel_dim"),
            num_experts=get("num_experts", 0) or 0, num_experts_per_tok=get("num_experts_per_tok", 0) or 0,
            moe_intermediate_size=get("moe_intermediate_size", 0) or 0,
            shared_expert_intermediate_size=get("shared_expert_intermediate_size", 0) or 0,
            norm_topk_prob=bool(get("norm_topk_prob", True)),
            decoder_sparse_step=get("decoder_sparse_step", 1) or 1,
            mlp_only_layers=tuple(get("mlp_only_layers") or ()), rms_norm_eps=get("rms_norm_eps"),
            attention_bias=bool(get("attention_bias", False)),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            hidden_act=get("hidden_act", "silu"))
