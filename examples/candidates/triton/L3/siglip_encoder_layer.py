"""SiglipEncoderLayer from this tree's modules: LayerNorm -> attention (one fused q/k/v GEMM, the
Triton attention over the image batch) -> residual add, LayerNorm -> fc1 -> tanh GELU (fc1's bias
fused) -> fc2 -> residual add."""
from torch import nn

from ..L1.encoder_attention import MultiHeadAttention
from ..L1.layer_norm import LayerNorm
from ..L1.linear import QKVParallelLinear, RowParallelLinear
from ..L2.vit_mlp import Dinov2MLP


class _SelfAttention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.hidden_size, head_dim = hidden_size, hidden_size // num_heads
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_heads, num_heads, bias=True)
        self.attn = MultiHeadAttention(num_heads, head_dim, head_dim ** -0.5)
        self.out_proj = RowParallelLinear(hidden_size, hidden_size, bias=True)

    def forward(self, x):
        q, k, v = self.qkv_proj(x).split(self.hidden_size, dim=-1)
        return self.out_proj(self.attn(q, k, v))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, intermediate_size, layer_norm_eps=1e-6,
                 hidden_act="gelu_pytorch_tanh"):
        super().__init__()
        self.layer_norm1 = LayerNorm(hidden_size, eps=layer_norm_eps)
        self.self_attn = _SelfAttention(hidden_size, num_attention_heads)
        self.layer_norm2 = LayerNorm(hidden_size, eps=layer_norm_eps)
        self.mlp = Dinov2MLP(hidden_size, intermediate_size, hidden_act)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.self_attn(self.layer_norm1(hidden_states))
        return hidden_states + self.mlp(self.layer_norm2(hidden_states))
