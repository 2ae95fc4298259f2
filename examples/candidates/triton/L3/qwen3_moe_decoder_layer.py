"""Qwen3MoeDecoderLayer from this tree's modules: Qwen3 attention, then the MoE block on sparse
layers or this tree's dense LlamaMLP on ``mlp_only_layers``."""
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.llama_mlp import LlamaMLP
from ..L2.qwen3_moe import Qwen3MoeSparseMoeBlock
from .mixtral_decoder_layer import attention, pre_norm


class Qwen3MoeDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        c = config
        self.self_attn = attention(c)
        sparse = c.num_experts > 0 and layer_idx not in c.mlp_only_layers and (layer_idx + 1) % c.decoder_sparse_step == 0
        self.mlp = Qwen3MoeSparseMoeBlock(c.hidden_size, c.moe_intermediate_size, c.num_experts, c.top_k,
                                          c.norm_topk_prob) if sparse else \
            LlamaMLP(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, positions, hidden_states, residual):
        return pre_norm(self, self.mlp, positions, hidden_states, residual)
