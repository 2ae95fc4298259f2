"""Dinov2Layer from this tree's modules: LayerNorm -> attention (one fused q/k/v GEMM, the Triton
attention over the image batch) -> LayerScale -> residual, LayerNorm -> fc1 -> GELU (fc1's bias fused)
-> fc2 -> LayerScale -> residual. Each gain and its residual add is one addcmul."""
import torch
from torch import nn

from ..L1.encoder_attention import MultiHeadAttention
from ..L1.layer_norm import LayerNorm
from ..L1.linear import QKVParallelLinear, RowParallelLinear
from ..L2.vit_mlp import Dinov2MLP


class _LayerScale(nn.Module):
    def __init__(self, hidden_size, init_value=1.0):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.full((hidden_size,), float(init_value)))

    def forward(self, branch, residual):
        return torch.addcmul(residual, branch, self.lambda1.to(branch.dtype))


class _Attention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.hidden_size, head_dim = hidden_size, hidden_size // num_heads
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_heads, num_heads, bias=True)
        self.attn = MultiHeadAttention(num_heads, head_dim, head_dim ** -0.5)
        self.o_proj = RowParallelLinear(hidden_size, hidden_size, bias=True)

    def forward(self, x):
        q, k, v = self.qkv_proj(x).split(self.hidden_size, dim=-1)
        return self.o_proj(self.attn(q, k, v))


class Dinov2Layer(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, mlp_ratio=4.0, layer_norm_eps=1e-6, hidden_act="gelu",
                 layerscale_value=1.0):
        super().__init__()
        self.norm1 = LayerNorm(hidden_size, eps=layer_norm_eps)
        self.attention = _Attention(hidden_size, num_attention_heads)
        self.layer_scale1 = _LayerScale(hidden_size, layerscale_value)
        self.norm2 = LayerNorm(hidden_size, eps=layer_norm_eps)
        self.mlp = Dinov2MLP(hidden_size, int(hidden_size * mlp_ratio), hidden_act)
        self.layer_scale2 = _LayerScale(hidden_size, layerscale_value)

    def forward(self, hidden_states):
        hidden_states = self.layer_scale1(self.attention(self.norm1(hidden_states)), hidden_states)
        return self.layer_scale2(self.mlp(self.norm2(hidden_states)), hidden_states)
