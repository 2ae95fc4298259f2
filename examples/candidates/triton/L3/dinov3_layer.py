"""DINOv3ViTLayer from this tree's modules: LayerNorm -> one fused q/k/v GEMM -> the Triton 2-D RoPE on
the patch tokens' q and k -> the Triton attention over the image batch -> o_proj -> LayerScale ->
residual, LayerNorm -> up_proj -> GELU (up_proj's bias fused) -> down_proj (or the gated SiLU MLP)
-> LayerScale -> residual. Each gain and its residual add is one addcmul."""
import torch
from torch import nn

from ..L1.encoder_attention import MultiHeadAttention
from ..L1.gelu import GELU
from ..L1.layer_norm import LayerNorm
from ..L1.linear import MergedColumnParallelLinear, QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from ..L1.rope_2d import DINOv3ViTRopePositionEmbedding
from ..L1.silu_and_mul import SiluAndMul

_DEFAULTS = dict(num_register_tokens=0, layer_norm_eps=1e-5, hidden_act="gelu", rope_theta=100.0, query_bias=True,
                 key_bias=False, value_bias=True, proj_bias=True, mlp_bias=True, use_gated_mlp=False,
                 layerscale_value=1.0)


def _get(config, key):
    value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
    return _DEFAULTS.get(key) if value is None else value


class _LayerScale(nn.Module):
    def __init__(self, hidden_size, init_value=1.0):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.full((hidden_size,), float(init_value)))

    def forward(self, branch, residual):
        return torch.addcmul(residual, branch, self.lambda1.to(branch.dtype))


class _Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.hidden_size, heads = _get(config, "hidden_size"), _get(config, "num_attention_heads")
        head_dim = self.hidden_size // heads
        bias = any(_get(config, k) for k in ("query_bias", "key_bias", "value_bias"))
        self.qkv_proj = QKVParallelLinear(self.hidden_size, head_dim, heads, heads, bias=bias)
        self.rotary_emb = DINOv3ViTRopePositionEmbedding(head_dim, _get(config, "rope_theta"),
                                                         1 + _get(config, "num_register_tokens"))
        self.attn = MultiHeadAttention(heads, head_dim, head_dim ** -0.5)
        self.o_proj = RowParallelLinear(self.hidden_size, self.hidden_size, bias=_get(config, "proj_bias"))

    def forward(self, x, grid_height, grid_width):
        q, k, v = self.qkv_proj(x).split(self.hidden_size, dim=-1)
        q, k = self.rotary_emb(q, k, grid_height, grid_width)
        return self.o_proj(self.attn(q, k, v))


class _MLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, hidden_act, bias):
        super().__init__()
        self.up_proj = ReplicatedLinear(hidden_size, intermediate_size, bias=bias)
        self.act = GELU("tanh" if hidden_act in ("gelu_pytorch_tanh", "gelu_new") else "none")
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x):
        return self.down_proj(self.act(torch.matmul(x, self.up_proj.weight.t()), self.up_proj.bias))


class _GatedMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, bias):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DINOv3ViTLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, eps = _get(config, "hidden_size"), _get(config, "layer_norm_eps")
        scale = _get(config, "layerscale_value")
        inter, bias = _get(config, "intermediate_size"), _get(config, "mlp_bias")
        self.norm1 = LayerNorm(hidden, eps=eps)
        self.attention = _Attention(config)
        self.layer_scale1 = _LayerScale(hidden, scale)
        self.norm2 = LayerNorm(hidden, eps=eps)
        self.mlp = (_GatedMLP(hidden, inter, bias) if _get(config, "use_gated_mlp")
                    else _MLP(hidden, inter, _get(config, "hidden_act"), bias))
        self.layer_scale2 = _LayerScale(hidden, scale)

    def forward(self, hidden_states, grid_height, grid_width):
        attended = self.attention(self.norm1(hidden_states), grid_height, grid_width)
        hidden_states = self.layer_scale1(attended, hidden_states)
        return self.layer_scale2(self.mlp(self.norm2(hidden_states)), hidden_states)
