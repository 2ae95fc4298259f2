"""Dinov2Layer: DINOv2's pre-norm ViT block with LayerScale, over a padded batch of images.

``x + lambda1 * attention(norm1(x))``, then ``h + lambda2 * mlp(norm2(h))`` with the MLP
``fc2(gelu(fc1(.)))`` (exact GELU, width ``mlp_ratio * hidden``) and bidirectional attention of
every token over its own image (``MultiHeadAttention``, scale ``head_dim ** -0.5``; no key mask:
the images of a batch share one size). ``forward(hidden_states[B, S, D]) -> [B, S, D]``.

LayerScale is a learned per-channel gain on each branch before its residual add (CaiT). DINOv2
trains it from 1e-5 (Hugging Face's config says ``layerscale_value=1.0``, which only its random
init reads; trained gains come from the checkpoint), so the branches enter the residual stream
scaled well below one: a gain applied to the wrong tensor changes the output at once.

Parameter names are ours (q/k/v fused into one projection, so attention is one GEMM);
``hf_layer_state_dict`` maps a Hugging Face layer's keys onto them, in both spellings: the
checkpoints' (``attention.attention.query``, ``attention.output.dense``) and transformers 5's
(``attention.q_proj``, ``attention.o_proj``).

Numerics: each child's own (LayerNorm, GEMMs, GELU with fc1's bias fused, attention); the scaled
branch is added to the residual in float32 for half types (float64 stays float64), one rounding,
``torch.addcmul`` on the fast path.
"""
from typing import Dict

import torch
from torch import nn

from ..dispatch import compute_dtype
from ..L1.encoder_attention import MultiHeadAttention
from ..L1.layer_norm import LayerNorm
from ..L1.linear import QKVParallelLinear, RowParallelLinear
from ..L2.vit_mlp import Dinov2MLP
from ..native import run
from ..records import RecordsInit



class LayerScale(RecordsInit, nn.Module):
    """``residual + lambda1 * branch``: the per-channel gain and its residual add as one step."""

    def __init__(self, hidden_size: int, init_value: float = 1.0):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.full((hidden_size,), float(init_value)))

    def forward(self, branch: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(residual, branch, self.lambda1.to(branch.dtype))

    def forward_native(self, branch, residual):
        dt = compute_dtype(branch.dtype)
        return (residual.to(dt) + branch.to(dt) * self.lambda1.to(dt)).to(branch.dtype)


class Dinov2Attention(RecordsInit, nn.Module):
    OUTPUT_NAME = "o_proj"  # the output projection's name (SigLIP's layer calls it out_proj)

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden size {hidden_size} is not a multiple of {num_heads} heads")
        self.hidden_size, self.head_dim = hidden_size, hidden_size // num_heads
        self.qkv_proj = QKVParallelLinear(hidden_size, self.head_dim, num_heads, num_heads, bias=True)
        self.attn = MultiHeadAttention(num_heads, self.head_dim, self.head_dim ** -0.5)
        setattr(self, self.OUTPUT_NAME, RowParallelLinear(hidden_size, hidden_size, bias=True))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states):
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        q, k, v = run(self.qkv_proj, native, hidden_states).split(self.hidden_size, dim=-1)  # column views
        return run(getattr(self, self.OUTPUT_NAME), native, run(self.attn, native, q, k, v))


class Dinov2Layer(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, num_attention_heads: int, mlp_ratio: float = 4.0,
                 layer_norm_eps: float = 1e-6, hidden_act: str = "gelu", layerscale_value: float = 1.0):
        super().__init__()
        self.norm1 = LayerNorm(hidden_size, eps=layer_norm_eps)
        self.attention = Dinov2Attention(hidden_size, num_attention_heads)
        self.layer_scale1 = LayerScale(hidden_size, layerscale_value)
        self.norm2 = LayerNorm(hidden_size, eps=layer_norm_eps)
        self.mlp = Dinov2MLP(hidden_size, int(hidden_size * mlp_ratio), hidden_act)
        self.layer_scale2 = LayerScale(hidden_size, layerscale_value)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states):
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        attended = run(self.attention, native, run(self.norm1, native, hidden_states))
        hidden_states = run(self.layer_scale1, native, attended, hidden_states)
        mlp_out = run(self.mlp, native, run(self.norm2, native, hidden_states))
        return run(self.layer_scale2, native, mlp_out, hidden_states)


# our name -> the Hugging Face layer's names, checkpoint spelling first, then transformers 5's
_HF_RENAMES = {
    "norm1.weight": ("norm1.weight",), "norm1.bias": ("norm1.bias",),
    "norm2.weight": ("norm2.weight",), "norm2.bias": ("norm2.bias",),
    "attention.o_proj.weight": ("attention.output.dense.weight", "attention.o_proj.weight"),
    "attention.o_proj.bias": ("attention.output.dense.bias", "attention.o_proj.bias"),
    "layer_scale1.lambda1": ("layer_scale1.lambda1",), "layer_scale2.lambda1": ("layer_scale2.lambda1",),
    "mlp.fc1.weight": ("mlp.fc1.weight",), "mlp.fc1.bias": ("mlp.fc1.bias",),
    "mlp.fc2.weight": ("mlp.fc2.weight",), "mlp.fc2.bias": ("mlp.fc2.bias",),
}
_HF_QKV = {"q": ("attention.attention.query", "attention.q_proj"),
           "k": ("attention.attention.key", "attention.k_proj"),
           "v": ("attention.attention.value", "attention.v_proj")}


def _first(hf_state: Dict[str, torch.Tensor], prefix: str, names) -> torch.Tensor:
    for name in names:
        if prefix + name in hf_state:
            return hf_state[prefix + name]
    raise KeyError(f"none of {[prefix + n for n in names]} in the state dict")


def hf_layer_state_dict(hf_state: Dict[str, torch.Tensor], prefix: str = "") -> Dict[str, torch.Tensor]:
    """A ``Dinov2Layer`` state dict from a Hugging Face one (``prefix``: e.g. ``encoder.layer.3.``);
    query, key and value stacked in that order into ``attention.qkv_proj`` (QKVParallelLinear's rows)."""
    ours = {name: _first(hf_state, prefix, names) for name, names in _HF_RENAMES.items()}
    for part in ("weight", "bias"):
        ours[f"attention.qkv_proj.{part}"] = torch.cat(
            [_first(hf_state, prefix, [f"{n}.{part}" for n in _HF_QKV[s]]) for s in ("q", "k", "v")])
    return ours
