"""LlamaDecoderLayer from this tree's modules: pre-norm attention and MLP, the residual add fused
into the two RMSNorms (Triton)."""
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.llama_attention import LlamaAttention
from ..L2.llama_mlp import LlamaMLP


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = config
        self.self_attn = LlamaAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                        c.max_position_embeddings, c.rope_theta, c.rope_scaling, c.rms_norm_eps,
                                        qkv_bias=c.qkv_bias, qk_norm=c.qk_norm)
        self.mlp = LlamaMLP(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, positions, hidden_states, residual):
        if residual is None:  # first layer: its input is the residual stream
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual
