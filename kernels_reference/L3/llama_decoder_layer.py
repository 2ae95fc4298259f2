"""LlamaDecoderLayer (vLLM): pre-norm attention and MLP with the residual add fused into the norms.

``forward(positions, hidden_states, residual) -> (hidden_states, residual)``; the first layer gets
``residual=None`` and keeps its input as the residual.
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.llama_attention import LlamaAttention
from ..L2.llama_mlp import LlamaMLP
from ..model_config import LlamaArchConfig
from ..native import run
from ..records import RecordsInit


def llama_attention(config: LlamaArchConfig) -> LlamaAttention:
    """The attention block every Llama-shaped layer (dense or MoE) builds from its config."""
    return LlamaAttention(
        config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
        config.max_position_embeddings, config.rope_theta, config.rope_scaling, config.rms_norm_eps,
        qkv_bias=config.qkv_bias, qk_norm=config.qk_norm)


def pre_norm_forward(layer: nn.Module, mlp: nn.Module, positions, hidden_states, residual, native: bool,
                     mixer: Optional[nn.Module] = None):
    """norm -> token mixer -> fused add + norm -> ``mlp`` (dense MLP or MoE block), shared by the
    Llama, Mixtral, Qwen3-MoE and Qwen3-Next layers. The mixer is ``layer.self_attn`` (called with
    the positions) unless ``mixer`` names one that takes the hidden states alone (Qwen3-Next's
    gated DeltaNet)."""
    if residual is None:
        residual = hidden_states
        hidden_states = run(layer.input_layernorm, native, hidden_states)
    else:
        hidden_states, residual = run(layer.input_layernorm, native, hidden_states, residual)
    if mixer is None:
        hidden_states = run(layer.self_attn, native, positions, hidden_states)
    else:
        hidden_states = run(mixer, native, hidden_states)
    hidden_states, residual = run(layer.post_attention_layernorm, native, hidden_states, residual)
    return run(mlp, native, hidden_states), residual


class LlamaDecoderLayer(RecordsInit, nn.Module):
    def __init__(self, config: LlamaArchConfig):
        super().__init__()
        self.self_attn = llama_attention(config)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._forward(positions, hidden_states, residual, native=False)

    def forward_native(self, positions, hidden_states, residual):
        return self._forward(positions, hidden_states, residual, native=True)

    def _forward(self, positions, hidden_states, residual, native):
        return pre_norm_forward(self, self.mlp, positions, hidden_states, residual, native)
