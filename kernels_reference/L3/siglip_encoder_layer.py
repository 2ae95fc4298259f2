"""SiglipEncoderLayer: the pre-norm ViT block of SigLIP / SigLIP-2 vision towers, over a padded batch.

``x + self_attn(layer_norm1(x))``, then ``h + mlp(layer_norm2(h))`` with the MLP ``fc2(gelu(fc1(.)))``
(the tanh GELU: the configs say ``gelu_pytorch_tanh``) and bidirectional attention of every token over
its own image (scale ``head_dim ** -0.5``; so400m has 16 heads of 72). No class token and no
LayerScale: the branches are added to the residual stream as they are.
``forward(hidden_states[B, S, D]) -> [B, S, D]``.

Parameter names are vLLM's (``self_attn.qkv_proj`` with q/k/v fused into one GEMM,
``self_attn.out_proj``, ``mlp.fc1`` / ``mlp.fc2``, ``layer_norm1`` / ``layer_norm2``);
``hf_layer_state_dict`` maps a Hugging Face layer's separate ``q_proj`` / ``k_proj`` / ``v_proj`` onto
them. The MLP is DINOv2's (fc1's bias fused into the GELU); the attention differs from DINOv2's only
in the output projection's name.

Numerics: each child's own; a residual add is one rounding of the exact sum in the activation
dtype (what ``residual + branch`` does in every dtype).
"""
from typing import Dict

import torch
from torch import nn

from ..L1.layer_norm import LayerNorm
from ..L2.vit_mlp import Dinov2MLP
from ..native import run
from ..records import RecordsInit
from .dinov2_layer import Dinov2Attention, _first

SiglipMLP = Dinov2MLP  # fc1 -> GELU (bias fused) -> fc2, the same module under vLLM's names


class SiglipAttention(Dinov2Attention):
    """q/k/v fused, bidirectional attention over the padded batch, then ``out_proj``: DINOv2's
    attention block under SigLIP's (and vLLM's) name for the output projection."""
    OUTPUT_NAME = "out_proj"


class SiglipEncoderLayer(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, num_attention_heads: int, intermediate_size: int,
                 layer_norm_eps: float = 1e-6, hidden_act: str = "gelu_pytorch_tanh"):
        super().__init__()
        self.layer_norm1 = LayerNorm(hidden_size, eps=layer_norm_eps)
        self.self_attn = SiglipAttention(hidden_size, num_attention_heads)
        self.layer_norm2 = LayerNorm(hidden_size, eps=layer_norm_eps)
        self.mlp = SiglipMLP(hidden_size, intermediate_size, hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states):
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        hidden_states = hidden_states + run(self.self_attn, native, run(self.layer_norm1, native, hidden_states))
        return hidden_states + run(self.mlp, native, run(self.layer_norm2, native, hidden_states))


# our name -> the Hugging Face layer's (transformers' SiglipEncoderLayer and the checkpoints agree)
_HF_RENAMES = {f"{ours}.{part}": f"{hf}.{part}" for part in ("weight", "bias") for ours, hf in (
    ("layer_norm1", "layer_norm1"), ("layer_norm2", "layer_norm2"), ("self_attn.out_proj", "self_attn.out_proj"),
    ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2"))}


def hf_layer_state_dict(hf_state: Dict[str, torch.Tensor], prefix: str = "") -> Dict[str, torch.Tensor]:
    """A ``SiglipEncoderLayer`` state dict from a Hugging Face one (``prefix``: e.g.
    ``vision_model.encoder.layers.3.``); q, k and v stacked in that order into ``self_attn.qkv_proj``."""
    ours = {name: _first(hf_state, prefix, (hf,)) for name, hf in _HF_RENAMES.items()}
    for part in ("weight", "bias"):
        ours[f"self_attn.qkv_proj.{part}"] = torch.cat(
            [_first(hf_state, prefix, (f"self_attn.{s}_proj.{part}",)) for s in "qkv"])
    return ours
