"""Qwen3MoeDecoderLayer (vLLM): Qwen3's attention (per-head q/k norm) and, per layer, either the
sparse MoE block or a dense LlamaMLP (layers in ``mlp_only_layers``, or off the
``decoder_sparse_step`` grid; Qwen3-30B-A3B has every layer sparse).

``Qwen3MoeDecoderLayer(config, layer_idx)``; ``forward(positions, hidden_states, residual) ->
(hidden_states, residual)`` as LlamaDecoderLayer.
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.llama_mlp import LlamaMLP
from ..L2.qwen3_moe import Qwen3MoeSparseMoeBlock
from ..model_config import LlamaArchConfig
from ..records import RecordsInit
from .llama_decoder_layer import llama_attention, pre_norm_forward


class Qwen3MoeDecoderLayer(RecordsInit, nn.Module):
    def __init__(self, config: LlamaArchConfig, layer_idx: int = 0):
        super().__init__()
        self.self_attn = llama_attention(config)
        if config.is_sparse_layer(layer_idx):
            self.mlp = Qwen3MoeSparseMoeBlock(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                                              config.top_k, config.norm_topk_prob)
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        return pre_norm_forward(self, self.mlp, positions, hidden_states, residual, native=False)

    def forward_native(self, positions, hidden_states, residual):
        return pre_norm_forward(self, self.mlp, positions, hidden_states, residual, native=True)
