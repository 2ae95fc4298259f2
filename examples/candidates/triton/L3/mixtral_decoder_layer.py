"""MixtralDecoderLayer from this tree's modules: the Llama layer with the MoE block as its MLP."""
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.llama_attention import LlamaAttention
from ..L2.mixtral_moe import MixtralMoE


def attention(c):
    return LlamaAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                          c.max_position_embeddings, c.rope_theta, c.rope_scaling, c.rms_norm_eps,
                          qkv_bias=c.qkv_bias, qk_norm=c.qk_norm)


def pre_norm(layer, mlp, positions, hidden_states, residual):
    if residual is None:  # first layer: its input is the residual stream
        residual = hidden_states
        hidden_states = layer.input_layernorm(hidden_states)
    else:
        hidden_states, residual = layer.input_layernorm(hidden_states, residual)
    hidden_states = layer.self_attn(positions, hidden_states)
    hidden_states, residual = layer.post_attention_layernorm(hidden_states, residual)
    return mlp(hidden_states), residual


class MixtralDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = config
        self.self_attn = attention(c)
        self.block_sparse_moe = MixtralMoE(c.num_experts, c.top_k, c.hidden_size, c.moe_intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, positions, hidden_states, residual):
        return pre_norm(self, self.block_sparse_moe, positions, hidden_states, residual)
