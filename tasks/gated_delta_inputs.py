"""Inputs of the gated delta rule as Qwen3-Next's gated DeltaNet layer produces them.

* q, k and v are views of one buffer: the layer runs its fused q|k|v projection through the causal
  short convolution with SiLU and splits the result per head without copying, so a token's q heads
  are followed by its k and v heads in memory (token stride = 2 * key_dim + value_dim).
* g = -exp(A_log) * softplus(a + dt_bias), float32 (vLLM's gating kernel writes it in float32): a
  per-head decay rate A times a per-token softplus. The heads' rates are spread from slow (states
  that live across many 64-token chunks) to fast (states forgotten within a few tokens), so every
  case has heads where a chunk-boundary or initial-state error shows.
* beta = sigmoid(b), in the activation dtype.
* Initial states, where a case carries them, are float32 [N, Hv, K, V] of the size a state reaches
  in a running sequence (entries ~0.1: S^T k then predicts values of the size of v).
"""
import math
from typing import Dict, Sequence

import torch
import torch.nn.functional as F

from .linear_inputs import cu_seqlens

SLOWEST_RATE, FASTEST_RATE = 0.01, 8.0  # exp(A_log) of the slowest and fastest value head
STATE_SCALE = 0.1


def decay_rates(heads: int, gen: torch.Generator, device) -> torch.Tensor:
    """exp(A_log) per value head: log-spaced from slow to fast, each jittered by up to 20%."""
    base = torch.logspace(math.log10(SLOWEST_RATE), math.log10(FASTEST_RATE), heads, device=device)
    jitter = 1 + 0.2 * (2 * torch.rand(heads, generator=gen, device=device) - 1)
    return base * jitter


def gated_delta_inputs(lengths: Sequence[int], k_heads: int, v_heads: int, head_k_dim: int, head_v_dim: int,
                       with_state: bool, gen: torch.Generator, device, dtype) -> Dict[str, object]:
    """Keyword arguments of ``GatedDeltaRule.forward`` for one packed batch of sequences."""
    t, n = sum(lengths), len(lengths)
    key_dim, value_dim = k_heads * head_k_dim, v_heads * head_v_dim
    mixed = F.silu(torch.randn((t, 2 * key_dim + value_dim), generator=gen, device=device)).to(dtype)
    q = mixed[:, :key_dim].view(1, t, k_heads, head_k_dim)
    k = mixed[:, key_dim:2 * key_dim].view(1, t, k_heads, head_k_dim)
    v = mixed[:, 2 * key_dim:].view(1, t, v_heads, head_v_dim)
    a = torch.randn((t, v_heads), generator=gen, device=device)
    dt_bias = 0.5 * torch.randn(v_heads, generator=gen, device=device)
    g = -decay_rates(v_heads, gen, device) * F.softplus(a + dt_bias)
    beta = torch.sigmoid(torch.randn((t, v_heads), generator=gen, device=device)).to(dtype)
    state = None
    if with_state:
        state = STATE_SCALE * torch.randn((n, v_heads, head_k_dim, head_v_dim), generator=gen, device=device)
    return {"q": q, "k": k, "v": v, "g": g[None], "beta": beta[None], "initial_state": state,
            "output_final_state": True, "use_qk_l2norm_in_kernel": True,
            "cu_seqlens": cu_seqlens(lengths, device)}
