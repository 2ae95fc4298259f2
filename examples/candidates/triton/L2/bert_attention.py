"""BertAttention from this tree's L1 modules: fused qkv projection, the Triton flash kernel over the
packed batch, output dense, and the post-norm add & norm in one Triton LayerNorm (residual fused)."""
from torch import nn

from ..L1.encoder_attention import EncoderOnlyAttention
from ..L1.layer_norm import LayerNorm
from ..L1.linear import QKVParallelLinear, RowParallelLinear


class BertSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        head_dim = hidden_size // num_attention_heads
        self.hidden_size = hidden_size
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_attention_heads, num_attention_heads, bias=True)
        self.attn = EncoderOnlyAttention(num_attention_heads, head_dim, head_dim ** -0.5)

    def forward(self, hidden_states):
        qkv = self.qkv_proj(hidden_states)
        h = self.hidden_size
        return self.attn(qkv[:, :h], qkv[:, h: 2 * h], qkv[:, 2 * h:])  # column views of the fused output


class BertSelfOutput(nn.Module):
    def __init__(self, hidden_size, layer_norm_eps):
        super().__init__()
        self.dense = RowParallelLinear(hidden_size, hidden_size, bias=True)
        self.LayerNorm = LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, hidden_states, input_tensor):
        out, _ = self.LayerNorm(self.dense(hidden_states), input_tensor)
        return out


class BertAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, layer_norm_eps):
        super().__init__()
        self.self = BertSelfAttention(hidden_size, num_attention_heads)
        self.output = BertSelfOutput(hidden_size, layer_norm_eps)

    def forward(self, hidden_states):
        return self.output(self.self(hidden_states), hidden_states)
