"""Qwen3NextDecoderLayer (vLLM): one layer of Qwen3-Next's hybrid stack.

    input_layernorm (GemmaRMSNorm, residual add fused) -> token mixer
    -> post_attention_layernorm (GemmaRMSNorm, residual add fused) -> MoE block (or dense MLP)

The token mixer is the layer's ``layer_types`` entry: ``linear_attn`` (the gated DeltaNet, which
reads its state pools bound as ``linear_attn.state_cache`` and the step from the forward context)
or ``self_attn`` (gated full attention over the paged cache bound to ``self_attn.attn.kv_cache``).
Only the mixer's attribute name and its call differ (the DeltaNet takes no positions: its order is
the scan's); the norms are zero-centred (``1 + w``), as Qwen3-Next's RMSNorm is.

``Qwen3NextDecoderLayer(config, layer_idx)``; ``forward(positions, hidden_states, residual) ->
(hidden_states, residual)`` as LlamaDecoderLayer (the first layer gets ``residual=None``).
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..L1.gemma_rms_norm import GemmaRMSNorm
from ..L2.llama_mlp import LlamaMLP
from ..L2.qwen3_next_attention import Qwen3NextAttention
from ..L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet
from ..L2.qwen3_next_moe import Qwen3NextSparseMoeBlock
from ..qwen3_next_config import LINEAR, Qwen3NextArchConfig
from ..records import RecordsInit
from .llama_decoder_layer import pre_norm_forward


class Qwen3NextDecoderLayer(RecordsInit, nn.Module):
    def __init__(self, config: Qwen3NextArchConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        if self.layer_type == LINEAR:
            self.linear_attn = Qwen3NextGatedDeltaNet(**config.linear_attention_args())
        else:
            self.self_attn = Qwen3NextAttention(**config.attention_args())
        if config.is_sparse_layer(layer_idx):
            self.mlp = Qwen3NextSparseMoeBlock(**config.moe_args())
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._forward(positions, hidden_states, residual, native=False)

    def forward_native(self, positions, hidden_states, residual):
        return self._forward(positions, hidden_states, residual, native=True)

    def _forward(self, positions, hidden_states, residual, native):
        mixer = self.linear_attn if self.layer_type == LINEAR else None  # None: self_attn, with positions
        return pre_norm_forward(self, self.mlp, positions, hidden_states, residual, native, mixer)
