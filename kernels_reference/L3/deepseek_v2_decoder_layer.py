"""DeepseekV2DecoderLayer (vLLM): DeepSeek-V2's multi-head latent attention and, per layer, either a
dense LlamaMLP (``intermediate_size`` wide; layers before ``first_k_dense_replace`` or off the
``moe_layer_freq`` grid: layer 0 of V2 and V2-Lite) or the MoE block with shared experts.

``DeepseekV2DecoderLayer(config, layer_idx)``; ``forward(positions, hidden_states, residual) ->
(hidden_states, residual)`` as LlamaDecoderLayer (the residual add fused into the two norms).
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.deepseek_v2_attention import DeepseekV2MLAAttention
from ..L2.deepseek_v2_moe import DeepseekV2MoE
from ..L2.llama_mlp import LlamaMLP
from ..model_config import DeepseekV2ArchConfig
from ..records import RecordsInit
from .llama_decoder_layer import pre_norm_forward


class DeepseekV2DecoderLayer(RecordsInit, nn.Module):
    def __init__(self, config: DeepseekV2ArchConfig, layer_idx: int = 0):
        super().__init__()
        self.self_attn = DeepseekV2MLAAttention(**config.attention_args())
        if config.is_sparse_layer(layer_idx):
            self.mlp = DeepseekV2MoE(**config.moe.block_args())
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        return pre_norm_forward(self, self.mlp, positions, hidden_states, residual, native=False)

    def forward_native(self, positions, hidden_states, residual):
        return pre_norm_forward(self, self.mlp, positions, hidden_states, residual, native=True)
