"""MixtralDecoderLayer (vLLM): Llama's pre-norm layer with the MLP replaced by the MoE block.

``forward(positions, hidden_states, residual) -> (hidden_states, residual)`` as LlamaDecoderLayer.
The block is named ``block_sparse_moe`` as in vLLM and Mixtral's checkpoints.
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.mixtral_moe import MixtralMoE
from ..model_config import LlamaArchConfig
from ..records import RecordsInit
from .llama_decoder_layer import llama_attention, pre_norm_forward


class MixtralDecoderLayer(RecordsInit, nn.Module):
    def __init__(self, config: LlamaArchConfig):
        super().__init__()
        self.self_attn = llama_attention(config)
        self.block_sparse_moe = MixtralMoE(config.num_experts, config.top_k, config.hidden_size,
                                           config.moe_intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        return pre_norm_forward(self, self.block_sparse_moe, positions, hidden_states, residual, native=False)

    def forward_native(self, positions, hidden_states, residual):
        return pre_norm_forward(self, self.block_sparse_moe, positions, hidden_states, residual, native=True)
