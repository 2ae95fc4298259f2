"""RWKV-7's layer dimensions and the inputs of ``ChunkRWKV7`` as FLA's ``RWKV7Attention`` layer
produces them (RWKV-7 World 2.9B: 64-wide heads, value heads as wide as key heads).

* r, v and the raw key are projections of the token-shifted hidden states: unit-scale activations.
* w, the log decay, is -exp(-0.5) * sigmoid(w0 + lora(x)) (the layer's form of RWKV-LM's
  exp(-exp(-softplus(-(w0 + lora)) - 0.5))), in (-0.607, 0), computed in the activation dtype. The
  biases w0 are spread per channel from slow (sigmoid(-8): memory of thousands of tokens) to fast
  (sigmoid(3): a token or two), as the layer's initialisation spreads them; the low-rank part is
  tanh(x A) B of the model's decay rank. An error in the carried state or in the per-channel decay
  shows.
* iclr = sigmoid(a0 + x A' B') in (0, 1) (the in-context learning rate), kk = the L2-normalised
  key (per head) after a per-channel scale, and the key itself is k * (1 + (iclr - 1) * k_a).
  The op gets a = -kk and b = kk * iclr: the correction takes part of what the state holds along
  kk out before the token writes k v^T.
* Initial states, where a case carries them, are what the recurrence itself reaches: each
  sequence's state after a warm-up of WARMUP_TOKENS tokens drawn the same way (float32). Their
  size and their structure (little left along recent kk directions) are a running state's.
"""
import dataclasses
from typing import Dict, Sequence

import torch
import torch.nn.functional as F

from .configs import load_config
from .linear_inputs import cu_seqlens

RWKV7_MODELS = ("rwkv7-2.9b",)
RWKV7_CHUNK = 64  # the chunk FLA's RWKV7Attention passes to chunk_rwkv7

# The CPU profile keeps the real 64 x 64 heads, 2 of them: the interpreted kernel costs per
# program and the float64 truth per token, not per head width.
CPU_HEADS = {"rwkv7-2.9b": 2}

DECAY_BIAS_RANGE = (-8.0, 3.0)   # sigmoid -> log decays from about -2e-4 to -0.58 per token
ICLR_BIAS_RANGE = (-1.0, 0.6)    # iclr mostly 0.25 .. 0.65 before the data-dependent part
MAX_LOG_DECAY = 0.6065306597126334  # exp(-0.5): the log decay's magnitude never exceeds it
WARMUP_TOKENS = 96


@dataclasses.dataclass(frozen=True)
class RWKV7Dims:
    hidden_size: int
    num_heads: int
    head_dim: int       # K: RWKV-7's head size
    head_v_dim: int     # V: value_dim / num_heads (= head_dim in the World models)
    decay_low_rank_dim: int
    a_low_rank_dim: int


def rwkv7_dims(model: str, profile: str = "full") -> RWKV7Dims:
    cfg = load_config(model)
    head_dim = cfg["head_dim"]
    heads = cfg["hidden_size"] // head_dim
    value_dim = cfg.get("value_dim") or cfg["hidden_size"]
    return RWKV7Dims(cfg["hidden_size"], CPU_HEADS[model] if profile == "cpu" else heads, head_dim,
                     value_dim // heads, cfg["decay_low_rank_dim"], cfg["a_low_rank_dim"])


def _low_rank(tokens: int, channels: int, rank: int, gen, device, activation=None) -> torch.Tensor:
    """[tokens, channels]: a rank-``rank`` data-dependent term of unit-order size."""
    z = torch.randn((tokens, rank), generator=gen, device=device)
    down = torch.randn((rank, rank), generator=gen, device=device) / rank ** 0.5
    up = torch.randn((rank, channels), generator=gen, device=device) / rank ** 0.5
    hidden = z @ down
    return (activation(hidden) if activation is not None else hidden) @ up


def _uniform(low_high, shape, gen, device) -> torch.Tensor:
    low, high = low_high
    return low + (high - low) * torch.rand(shape, generator=gen, device=device)


def _draw_tokens(tokens: int, heads: int, head_dim: int, head_v_dim: int, channel: Dict[str, torch.Tensor],
                 decay_rank: int, a_rank: int, gen, device, dtype) -> Dict[str, torch.Tensor]:
    """[tokens, H, D] r, w, k, v, a, b in ``dtype`` with the per-channel parameters ``channel``."""
    keys = heads * head_dim
    shape = (tokens, heads, head_dim)
    r = torch.randn(shape, generator=gen, device=device).to(dtype)
    v = torch.randn((tokens, heads, head_v_dim), generator=gen, device=device).to(dtype)
    k_raw = torch.randn(shape, generator=gen, device=device)
    decay_logit = channel["w0"] + _low_rank(tokens, keys, decay_rank, gen, device, torch.tanh)
    w = (-MAX_LOG_DECAY * torch.sigmoid(decay_logit.to(dtype).float())).to(dtype).view(shape)
    iclr = torch.sigmoid(channel["a0"] + _low_rank(tokens, keys, a_rank, gen, device)).view(shape)
    kk = F.normalize(k_raw * channel["k_k"].view(heads, head_dim), dim=-1)
    k = (k_raw * (1 + (iclr - 1) * channel["k_a"].view(heads, head_dim))).to(dtype)
    return {"r": r, "w": w, "k": k, "v": v, "a": (-kk).to(dtype), "b": (kk * iclr).to(dtype)}


def _warm_states(n: int, heads: int, head_dim: int, head_v_dim: int, channel, decay_rank, a_rank, gen, device
                 ) -> torch.Tensor:
    """[n, H, K, V] float32: each sequence's state after WARMUP_TOKENS tokens of the recurrence,
    the n sequences stepped together."""
    toks = _draw_tokens(WARMUP_TOKENS * n, heads, head_dim, head_v_dim, channel, decay_rank, a_rank, gen,
                        device, torch.float32)
    toks = {name: x.view(n, WARMUP_TOKENS, *x.shape[1:]) for name, x in toks.items()}
    s = torch.zeros((n, heads, head_dim, head_v_dim), device=device)
    for t in range(WARMUP_TOKENS):
        w, k, v, a, b = (toks[name][:, t] for name in ("w", "k", "v", "a", "b"))
        removed = torch.einsum("nhk,nhkv->nhv", a, s)
        s = s * w.exp()[..., None] + b[..., None] * removed[:, :, None, :] + k[..., None] * v[:, :, None, :]
    return s


def rwkv7_inputs(lengths: Sequence[int], heads: int, head_dim: int, head_v_dim: int, with_state: bool,
                 gen: torch.Generator, device, dtype, decay_rank: int = 96, a_rank: int = 96) -> Dict[str, object]:
    """Keyword arguments of ``ChunkRWKV7.forward`` for one packed batch of sequences."""
    t, n, keys = sum(lengths), len(lengths), heads * head_dim
    # the layer's per-channel parameters: one draw per batch, shared by warm-up and tokens
    channel = {"w0": _uniform(DECAY_BIAS_RANGE, keys, gen, device), "a0": _uniform(ICLR_BIAS_RANGE, keys, gen, device),
               "k_k": _uniform((0.5, 1.0), keys, gen, device), "k_a": _uniform((0.8, 1.2), keys, gen, device)}
    toks = _draw_tokens(t, heads, head_dim, head_v_dim, channel, decay_rank, a_rank, gen, device, dtype)
    state = (_warm_states(n, heads, head_dim, head_v_dim, channel, decay_rank, a_rank, gen, device)
             if with_state else None)
    return {**{name: x[None] for name, x in toks.items()}, "scale": 1.0, "initial_state": state,
            "output_final_state": True, "cu_seqlens": cu_seqlens(lengths, device)}
