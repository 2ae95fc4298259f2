"""Mamba2DecoderLayer (vLLM): one layer of Mamba-2, a pre-norm residual block around the mixer.

    residual' = hidden_states + residual  (fused into the RMSNorm; the first layer has no residual
                                            yet and keeps its input as the residual stream)
    hidden'   = MambaMixer2(RMSNorm(residual'))

``forward(hidden_states, residual) -> (hidden_states, residual)`` as the other decoder layers; the
add of the mixer's output to the residual happens in the next layer's norm (or the model's
``norm_f``). HF's ``Mamba2Block`` adds it at the end of the block instead (and keeps the residual
in float32 with ``residual_in_fp32``); the sums are the same, vLLM's split is what is scored. The
mixer reads the step's metadata from the forward context and its bound ``state_cache`` pools.

:class:`Mamba2ArchConfig` holds the facts a layer and the model read from an HF ``Mamba2Config``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import torch
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.mamba_mixer2 import MambaMixer2
from ..native import run
from ..records import RecordsInit


@dataclasses.dataclass(frozen=True)
class Mamba2ArchConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    layer_norm_epsilon: float
    use_conv_bias: bool = True
    use_bias: bool = False
    hidden_act: str = "silu"
    tie_word_embeddings: bool = True
    architecture: str = "Mamba2ForCausalLM"

    @property
    def intermediate_size(self) -> int:
        # HF checks hidden_size * expand == num_heads * head_dim; a cut with fewer heads keeps the
        # heads' own width, so the mixer's width is always the heads'.
        return self.num_heads * self.head_dim

    @staticmethod
    def from_hf(config: Any) -> "Mamba2ArchConfig":
        """From an HF ``Mamba2Config`` (object) or its dict; a Mamba2ArchConfig passes through."""
        if isinstance(config, Mamba2ArchConfig):
            return config
        get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else \
            (lambda k, d=None: getattr(config, k, d))
        if get("rms_norm", True) is False:
            raise ValueError("Mamba2DecoderLayer supports the gated RMSNorm only (rms_norm=True)")
        return Mamba2ArchConfig(
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
            num_hidden_layers=get("num_hidden_layers"), num_heads=get("num_heads"), head_dim=get("head_dim"),
            state_size=get("state_size"), n_groups=get("n_groups"), conv_kernel=get("conv_kernel"),
            chunk_size=get("chunk_size"), layer_norm_epsilon=get("layer_norm_epsilon"),
            use_conv_bias=bool(get("use_conv_bias", True)), use_bias=bool(get("use_bias", False)),
            hidden_act=get("hidden_act", "silu"), tie_word_embeddings=bool(get("tie_word_embeddings", False)))


def mamba2_mixer(config: Mamba2ArchConfig) -> MambaMixer2:
    """The mixer every Mamba-2 layer builds from its config (vLLM's arguments)."""
    return MambaMixer2(
        hidden_size=config.hidden_size, ssm_state_size=config.state_size, conv_kernel_size=config.conv_kernel,
        intermediate_size=config.intermediate_size, use_conv_bias=config.use_conv_bias, use_bias=config.use_bias,
        n_groups=config.n_groups, num_heads=config.num_heads, head_dim=config.head_dim,
        rms_norm_eps=config.layer_norm_epsilon, activation=config.hidden_act, chunk_size=config.chunk_size)


class Mamba2DecoderLayer(RecordsInit, nn.Module):
    def __init__(self, config: Mamba2ArchConfig):
        super().__init__()
        config = Mamba2ArchConfig.from_hf(config)
        self.mixer = mamba2_mixer(config)
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def forward(self, hidden_states: torch.Tensor,
                residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._forward(hidden_states, residual, native=False)

    def forward_native(self, hidden_states, residual):
        return self._forward(hidden_states, residual, native=True)

    def _forward(self, hidden_states, residual, native):
        if residual is None:
            residual = hidden_states
            hidden_states = run(self.norm, native, hidden_states)
        else:
            hidden_states, residual = run(self.norm, native, hidden_states, residual)
        return run(self.mixer, native, hidden_states), residual
