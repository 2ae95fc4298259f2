"""DINOv3ViTLayer: DINOv3's pre-norm ViT block, LayerScale on both branches and the 2-D rotary embedding
on the patch tokens' queries and keys, over a padded batch of images.

``x + lambda1 * attention(norm1(x))``, then ``h + lambda2 * mlp(norm2(h))``.
``forward(hidden_states[B, S, D], grid_height, grid_width) -> [B, S, D]``; S = 1 class token +
``num_register_tokens`` + ``grid_height * grid_width`` patches (row by row). The attention projects
q/k/v with one GEMM, rotates q and k of the patch tokens (``DINOv3ViTRopePositionEmbedding``; the
class and register tokens are not rotated), attends every token over its own image (scale
``head_dim ** -0.5``, no mask) and projects out. The grid is an argument because the rotation needs
it and any image size runs (Hugging Face passes the grid's cos/sin instead, computed once per model
call from the image).

What the configs say (``DINOv3ViTConfig``; the ViT-L/16 checkpoint keeps its defaults): LayerNorm with
eps 1e-5; a query bias and a value bias but no key bias (``key_bias=False``: the original attention
masks the key part of its fused qkv bias, and with RoPE a key bias would not cancel in the softmax;
timm notes that the released weights' q/k/v biases are all zero, but transformers keeps q and v bias
parameters, so the task draws them like any bias); an output projection bias; the MLP
``down_proj(gelu(up_proj(x)))`` with biases and exact GELU (``use_gated_mlp=False``). ViT-H+ and
ViT-7B set ``use_gated_mlp`` with ``hidden_act="silu"``: ``down_proj(silu(gate) * up)``, served here
with gate and up as one GEMM (``SiluAndMul``).

Parameter names are ours (vLLM's fused ``qkv_proj`` and ``gate_up_proj``; HF's names elsewhere).
``qkv_proj`` has one bias over q, k and v when any of them has one; the rows of a part the config
gives no bias are zeros (what ``hf_layer_state_dict`` writes and what the task draws), as vLLM loads
Whisper's bias-free ``k_proj`` into its fused projection. ``hf_layer_state_dict`` maps a Hugging Face
``DINOv3ViTLayer`` state dict onto ours.

Numerics: each child's own (LayerNorm, GEMMs, the rotation in float32 with one rounding, attention,
GELU with the up projection's bias fused, LayerScale's add in float32 for half types).
"""
import dataclasses
from typing import Any, Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from ..L1.encoder_attention import MultiHeadAttention
from ..L1.gelu import GELU, gelu_approximation
from ..L1.layer_norm import LayerNorm
from ..L1.linear import ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from ..L1.rope_2d import DINOv3ViTRopePositionEmbedding
from ..L1.silu_and_mul import SiluAndMul
from ..model_config import _getter
from ..native import run
from ..records import RecordsInit
from .dinov2_layer import LayerScale


@dataclasses.dataclass(frozen=True)
class DINOv3ViTArchConfig:
    """What the DINOv3 modules read from a ``DINOv3ViTConfig`` (object or dict); missing fields take
    the config class's defaults."""
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    num_hidden_layers: int = 12
    num_register_tokens: int = 0
    patch_size: int = 16
    image_size: int = 224
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "gelu"
    rope_theta: float = 100.0
    query_bias: bool = True
    key_bias: bool = False
    value_bias: bool = True
    proj_bias: bool = True
    mlp_bias: bool = True
    use_gated_mlp: bool = False
    layerscale_value: float = 1.0

    @staticmethod
    def from_hf(config: Any) -> "DINOv3ViTArchConfig":
        get = _getter(config)
        fields = {f.name: get(f.name) for f in dataclasses.fields(DINOv3ViTArchConfig) if get(f.name) is not None}
        for name in ("patch_size", "image_size"):
            if isinstance(fields.get(name), (list, tuple)):
                if len(set(fields[name])) != 1:
                    raise ValueError(f"DINOv3: a non-square {name} {fields[name]} is not served")
                fields[name] = fields[name][0]
        return DINOv3ViTArchConfig(**fields)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_prefix_tokens(self) -> int:
        return 1 + self.num_register_tokens


class DINOv3ViTAttention(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_prefix_tokens: int = 1, rope_theta: float = 100.0,
                 query_bias: bool = True, key_bias: bool = False, value_bias: bool = True, proj_bias: bool = True):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden size {hidden_size} is not a multiple of {num_heads} heads")
        self.hidden_size, self.head_dim = hidden_size, hidden_size // num_heads
        self.part_has_bias = {"q": query_bias, "k": key_bias, "v": value_bias}
        self.qkv_proj = QKVParallelLinear(hidden_size, self.head_dim, num_heads, num_heads,
                                          bias=any(self.part_has_bias.values()))
        self.rotary_emb = DINOv3ViTRopePositionEmbedding(self.head_dim, rope_theta, num_prefix_tokens)
        self.attn = MultiHeadAttention(num_heads, self.head_dim, self.head_dim ** -0.5)
        self.o_proj = RowParallelLinear(hidden_size, hidden_size, bias=proj_bias)

    def zero_bias_rows(self) -> List[slice]:
        """The rows of ``qkv_proj.bias`` that belong to a part without a bias (held at zero)."""
        if self.qkv_proj.bias is None:
            return []
        starts = {part: self.qkv_proj.shard_offset(part) for part, has in self.part_has_bias.items() if not has}
        return [slice(start, start + self.qkv_proj.shard_size(part)) for part, start in starts.items()]

    def forward(self, hidden_states: torch.Tensor, grid_height: int, grid_width: int) -> torch.Tensor:
        return self._forward(hidden_states, grid_height, grid_width, native=False)

    def forward_native(self, hidden_states, grid_height, grid_width):
        return self._forward(hidden_states, grid_height, grid_width, native=True)

    def _forward(self, hidden_states, grid_height, grid_width, native):
        q, k, v = run(self.qkv_proj, native, hidden_states).split(self.hidden_size, dim=-1)  # column views
        q, k = run(self.rotary_emb, native, q, k, grid_height, grid_width)
        return run(self.o_proj, native, run(self.attn, native, q, k, v))


class DINOv3ViTMLP(RecordsInit, nn.Module):
    """``down_proj(gelu(up_proj(x)))``; the up projection's bias goes into the activation (the GEMM's
    bias + GELU epilogue)."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "gelu", bias: bool = True):
        super().__init__()
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, bias=bias)
        self.act = GELU(gelu_approximation(hidden_act))
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states):
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        up = F.linear(hidden_states, self.up_proj.weight)
        return run(self.down_proj, native, run(self.act, native, up, self.up_proj.bias))


class DINOv3ViTGatedMLP(RecordsInit, nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` with gate and up as one GEMM."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu", bias: bool = True):
        super().__init__()
        if hidden_act != "silu":
            raise ValueError(f"the gated MLP is served with silu only, not {hidden_act!r}")
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states):
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        gate_up = run(self.gate_up_proj, native, hidden_states)
        return run(self.down_proj, native, run(self.act_fn, native, gate_up))


class DINOv3ViTLayer(RecordsInit, nn.Module):
    def __init__(self, config: Any):
        """``config``: a ``DINOv3ViTConfig`` (object or dict, e.g. tasks/configs/dinov3-vitl16.json)."""
        super().__init__()
        cfg = DINOv3ViTArchConfig.from_hf(config)
        hidden = cfg.hidden_size
        self.norm1 = LayerNorm(hidden, eps=cfg.layer_norm_eps)
        self.attention = DINOv3ViTAttention(hidden, cfg.num_attention_heads, cfg.num_prefix_tokens, cfg.rope_theta,
                                            cfg.query_bias, cfg.key_bias, cfg.value_bias, cfg.proj_bias)
        self.layer_scale1 = LayerScale(hidden, cfg.layerscale_value)
        self.norm2 = LayerNorm(hidden, eps=cfg.layer_norm_eps)
        mlp = DINOv3ViTGatedMLP if cfg.use_gated_mlp else DINOv3ViTMLP
        self.mlp = mlp(hidden, cfg.intermediate_size, cfg.hidden_act, cfg.mlp_bias)
        self.layer_scale2 = LayerScale(hidden, cfg.layerscale_value)

    def forward(self, hidden_states: torch.Tensor, grid_height: int, grid_width: int) -> torch.Tensor:
        return self._forward(hidden_states, grid_height, grid_width, native=False)

    def forward_native(self, hidden_states, grid_height, grid_width):
        return self._forward(hidden_states, grid_height, grid_width, native=True)

    def _forward(self, hidden_states, grid_height, grid_width, native):
        attended = run(self.attention, native, run(self.norm1, native, hidden_states), grid_height, grid_width)
        hidden_states = run(self.layer_scale1, native, attended, hidden_states)
        mlp_out = run(self.mlp, native, run(self.norm2, native, hidden_states))
        return run(self.layer_scale2, native, mlp_out, hidden_states)


_HF_SAME = ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "layer_scale1.lambda1",
            "layer_scale2.lambda1", "attention.o_proj.weight", "attention.o_proj.bias",
            "mlp.up_proj.weight", "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias")


def hf_layer_state_dict(hf_state: Dict[str, torch.Tensor], prefix: str = "") -> Dict[str, torch.Tensor]:
    """A ``DINOv3ViTLayer`` state dict from a Hugging Face one (``prefix``: e.g. ``model.layer.3.``):
    q, k and v stacked into ``attention.qkv_proj`` (zeros for a part without a bias when another has
    one), a gated MLP's gate and up (it has a ``gate_proj``) stacked into ``mlp.gate_up_proj``; the
    rest by the same names."""
    gated = f"{prefix}mlp.gate_proj.weight" in hf_state
    ours = {name: hf_state[prefix + name] for name in _HF_SAME if prefix + name in hf_state
            and not (gated and name.startswith("mlp.up_proj"))}
    parts = [f"{prefix}attention.{p}_proj" for p in "qkv"]
    ours["attention.qkv_proj.weight"] = torch.cat([hf_state[f"{p}.weight"] for p in parts])
    biases = [hf_state.get(f"{p}.bias") for p in parts]
    if any(b is not None for b in biases):
        ours["attention.qkv_proj.bias"] = torch.cat([
            b if b is not None else hf_state[f"{p}.weight"].new_zeros(hf_state[f"{p}.weight"].shape[0])
            for p, b in zip(parts, biases)])
    if gated:
        for part in ("weight", "bias"):
            names = [f"{prefix}mlp.gate_proj.{part}", f"{prefix}mlp.up_proj.{part}"]
            if names[0] in hf_state:
                ours[f"mlp.gate_up_proj.{part}"] = torch.cat([hf_state[n] for n in names])
    return ours
