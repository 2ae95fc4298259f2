"""GLA's layer dimensions and the inputs of ``ChunkGLA`` as FLA's ``GatedLinearAttention`` layer
produces them (fla-hub/gla-1.3B-100B: no short convolution, no feature map).

* q, k and v are the layer's separate q/k/v projections, split per head without copying.
* g = logsigmoid(gk_proj(x)) / gate_logit_normalizer, in the activation dtype: gk_proj is a
  low-rank (16) projection with a bias per key channel. The biases are spread so that each head has
  channels that forget within a few tokens and channels whose memory spans many 64-token chunks:
  an error in the carried or initial state, or a decay shared across a head's channels, shows.
* Initial states, where a case carries them, are float32 [N, H, K, V] of the size a state reaches
  in a running sequence (its read-out is of the size of the fresh tokens' contribution).
"""
import dataclasses
from typing import Dict, Sequence

import torch
import torch.nn.functional as F

from .configs import load_config
from .linear_inputs import cu_seqlens

GLA_MODELS = ("gla-1.3b",)
GLA_CHUNK = 64  # flash-linear-attention's chunk_gla chunk

# The CPU profile keeps the real 256 x 512 head (what a GPU program scans per head) with 2 heads:
# the interpreted kernels cost per program, and the float64 truth per token, not per head width.
CPU_HEADS = {"gla-1.3b": 2}

# Bias range of the decay logits: logsigmoid(-3) / 16 ~ -0.19 per token (a few tokens of memory)
# up to logsigmoid(5) / 16 ~ -4e-4 (thousands of tokens).
GATE_BIAS_RANGE = (-3.0, 5.0)
STATE_SCALE = 1.0


@dataclasses.dataclass(frozen=True)
class GLADims:
    hidden_size: int
    num_heads: int
    head_k_dim: int
    head_v_dim: int
    gate_low_rank_dim: int
    gate_logit_normalizer: float


def gla_dims(model: str, profile: str = "full") -> GLADims:
    cfg = load_config(model)
    heads = cfg["num_heads"]
    key_dim, value_dim = int(cfg["hidden_size"] * cfg["expand_k"]), int(cfg["hidden_size"] * cfg["expand_v"])
    return GLADims(cfg["hidden_size"], CPU_HEADS[model] if profile == "cpu" else heads, key_dim // heads,
                   value_dim // heads, cfg["gate_low_rank_dim"], cfg["gate_logit_normalizer"])


def gla_decay(tokens: int, heads: int, head_k_dim: int, low_rank: int, normalizer: float,
              gen: torch.Generator, device, dtype) -> torch.Tensor:
    """[tokens, heads, head_k_dim] log decays: a per-channel bias (uniform in GATE_BIAS_RANGE) plus a rank-
    ``low_rank`` per-token term, through logsigmoid and the normaliser."""
    low, high = GATE_BIAS_RANGE
    channels = heads * head_k_dim
    bias = low + (high - low) * torch.rand(channels, generator=gen, device=device)
    z = torch.randn((tokens, low_rank), generator=gen, device=device)
    w = torch.randn((low_rank, channels), generator=gen, device=device) / low_rank ** 0.5
    logits = (z @ w + bias).to(dtype)
    return (F.logsigmoid(logits.float()) / normalizer).to(dtype).view(tokens, heads, head_k_dim)


def gla_inputs(lengths: Sequence[int], heads: int, head_k_dim: int, head_v_dim: int, with_state: bool,
               gen: torch.Generator, device, dtype, low_rank: int = 16, normalizer: float = 16.0
               ) -> Dict[str, object]:
    """Keyword arguments of ``ChunkGLA.forward`` for one packed batch of sequences."""
    t, n = sum(lengths), len(lengths)
    q, k = (torch.randn((1, t, heads, head_k_dim), generator=gen, device=device).to(dtype) for _ in range(2))
    v = torch.randn((1, t, heads, head_v_dim), generator=gen, device=device).to(dtype)
    g = gla_decay(t, heads, head_k_dim, low_rank, normalizer, gen, device, dtype)[None]
    state = None
    if with_state:
        state = STATE_SCALE * torch.randn((n, heads, head_k_dim, head_v_dim), generator=gen, device=device)
    return {"q": q, "k": k, "v": v, "g": g, "initial_state": state, "output_final_state": True,
            "cu_seqlens": cu_seqlens(lengths, device)}
