"""RWKV7Attention (flash-linear-attention's ``fla.layers.rwkv7``): the time-mix layer of RWKV-7
("Goose") models (RWKV-7 World 2.9B, fla-hub/rwkv7-2.9B-world), serving an engine step.

    token shift: delta = x_prev - x (x_prev the sequence's previous token, for a step's first token
        the sequence's carried shift state, zeros for a fresh sequence)
    xr, xw, xk, xv, xa, xg = x + delta * x_r, ... (per-channel mixes)
    r = r_proj(xr), k = k_proj(xk), v = v_proj(xv)
    w = -exp(-0.5) * sigmoid(w_lora(xw))                     the per-key-channel log decay
    v = lerp(v, v_first, sigmoid(v_lora(xv)))                layers > 0 (layer 0: v_first = v)
    iclr = sigmoid(a_lora(xa)); g = g_lora(xg)                the in-context learning rate, the gate
    kk = l2norm(k * k_k) per head; k = k * (1 + (iclr - 1) * k_a)
    o = ChunkRWKV7(r, w, k, v, a=-kk, b=kk * iclr, scale=1) per sequence, from and into its slot
    o = (GroupNorm_heads(o) + ((r * k * r_k).sum(-1) * v)) * g -> o_proj

Each LoRA is ``lora = Sequential(Linear(hidden, rank, bias=False), activation, Linear(rank, out))``
(FLA's ``fla.layers.rwkv6.LoRA``): w_lora with tanh and a bias, a_lora and v_lora with none and a
bias, g_lora with a sigmoid and no bias.

``RWKV7Attention(mode, hidden_size, head_dim, num_heads, decay_low_rank_dim, gate_low_rank_dim,
a_low_rank_dim, v_low_rank_dim, elementwise_affine, norm_eps, layer_idx, fuse_norm, value_dim,
num_hidden_layers)`` takes FLA's constructor arguments (the low-rank dims default as FLA derives
them); ``forward(hidden_states [T, hidden], v_first [T, value_dim] or None) -> (o [T, hidden],
v_first)`` runs one step of packed tokens. Layer 0 (``layer_idx == 0``) has no ``v_lora`` and
returns its own v as ``v_first``; later layers take it and return it unchanged, as FLA's layer
does (FLA returns ``(o, None, past_key_values, v_first)``; the attentions and cache slots are not
returned here, the cache living in the bound pools). Parameter names are FLA's (``x_r`` ..
``x_g`` [1, 1, hidden], ``k_k``, ``k_a`` [key_dim], ``r_k`` [H, K], ``r_proj``, ``k_proj``,
``v_proj``, ``o_proj``, ``w_lora.lora.{0,2}``, ``a_lora``, ``g_lora``, ``v_lora``, ``g_norm``), so a
checkpoint's ``model.layers.i.attn.*`` tensors load as they are.

The places a kernel goes wrong:

* Token shift across steps. Each sequence carries its last token's hidden state (FLA's
  ``conv_state``, the token-shift cache) from step to step: a continuing sequence's first token
  mixes with it, a fresh sequence's with zeros (its slot holds an earlier owner's row), and every
  sequence writes its last token's row back.
* The decay is computed from the activation-dtype LoRA output with the sigmoid in float32 and
  rounded once (the form the ``ChunkRWKV7`` task feeds its kernels); FLA's bf16 sigmoid is the same
  function at float32/64. kk is FLA's ``l2_norm`` (x / sqrt(sum x^2 + 1e-6), float32, rounded once).
* The norm is a per-head GroupNorm (mean and variance over each head's V-wide row, eps =
  head_dim * norm_eps, weight and bias), FLA's fused ``GroupNorm`` (``fuse_norm``) or
  ``nn.GroupNorm``: the same function. Then the bonus term ``(r . (k * r_k)) v`` per head, r and k
  being the ones the core saw (k after its iclr update), and the gate multiplies both.
* State: each sequence owns a slot of two pools bound as ``state_cache = (shift_states [slots,
  hidden] in the activation dtype, recurrent_states [slots, H, K, V] float32)``; the step's
  metadata (forward context) names the slots (``state_slots``) and whether each sequence continues
  (``has_initial_state``). Fresh sequences read zeros from both, never their slot's garbage; slots
  of other sequences are not touched.
* A step may mix phases: decode sequences (one token, continuing) first, prefills after, as vLLM
  orders them. Each phase is one ``ChunkRWKV7`` call (FLA's layer takes ``fused_mul_recurrent_rwkv7``
  below 64 tokens and ``chunk_rwkv7`` from 64 on: the same function).
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..forward_context import state_phases, step_states
from ..L1.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from ..L1.rwkv7 import ChunkRWKV7
from ..native import run
from ..records import RecordsInit

MAX_LOG_DECAY = 0.6065306597126334  # exp(-0.5)
L2_NORM_EPS = 1e-6  # FLA's l2_norm


class LoRA(nn.Module):
    """FLA's low-rank MLP: ``lora = Sequential(down, activation, up)``."""

    def __init__(self, input_dim: int, output_dim: int, low_rank_dim: int, bias: bool = True,
                 activation: Optional[str] = "tanh"):
        super().__init__()
        act = {None: nn.Identity, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "relu": nn.ReLU}[activation]
        self.lora = nn.Sequential(ReplicatedLinear(input_dim, low_rank_dim, bias=False), act(),
                                  ColumnParallelLinear(low_rank_dim, output_dim, bias=bias))

    def forward(self, x, native: bool = False):
        return run(self.lora[2], native, self.lora[1](run(self.lora[0], native, x)))


class GroupNorm(nn.Module):
    """Per-head LayerNorm of the V-wide rows with weight and bias, in float32, rounded once."""

    def __init__(self, num_groups: int, hidden_size: int, eps: float):
        super().__init__()
        self.num_groups, self.eps = num_groups, eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [T, H, V] -> [T, H * V]
        wide = torch.promote_types(x.dtype, torch.float32)
        h = x.to(wide)
        mean = h.mean(-1, keepdim=True)
        var = (h - mean).square().mean(-1, keepdim=True)
        h = ((h - mean) * torch.rsqrt(var + self.eps)).flatten(-2)
        return (h * self.weight.to(wide) + self.bias.to(wide)).to(x.dtype)


class RWKV7Attention(RecordsInit, nn.Module):
    def __init__(self, mode: str = "chunk", hidden_size: int = 1024, head_dim: Optional[int] = 64,
                 num_heads: Optional[int] = None, decay_low_rank_dim: Optional[int] = None,
                 gate_low_rank_dim: Optional[int] = None, a_low_rank_dim: Optional[int] = None,
                 v_low_rank_dim: Optional[int] = None, elementwise_affine: Optional[bool] = True,
                 norm_eps: float = 1e-5, layer_idx: Optional[int] = None, fuse_norm: bool = False,
                 value_dim: Optional[int] = None, num_hidden_layers: Optional[int] = None, **kwargs):
        super().__init__()
        if mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"RWKV7Attention has no mode {mode!r}")
        if not elementwise_affine:
            raise ValueError("RWKV7Attention takes the affine GroupNorm only (elementwise_affine=True)")
        self.mode, self.layer_idx, self.num_hidden_layers = mode, layer_idx, num_hidden_layers
        self.fuse_norm = fuse_norm  # FLA's fused GroupNorm or nn.GroupNorm: the same function
        self.hidden_size = self.key_dim = hidden_size
        self.value_dim = value_dim if value_dim is not None else hidden_size
        if head_dim is not None:
            self.head_dim, self.num_heads = head_dim, hidden_size // head_dim
        elif num_heads is not None:
            self.head_dim, self.num_heads = hidden_size // num_heads, num_heads
        else:
            raise ValueError("Either `head_dim` or `num_heads` must be specified.")
        self.head_v_dim = self.value_dim // self.num_heads
        factor, root = self.head_dim / 64, hidden_size ** 0.5
        # FLA's defaults where the config leaves a rank out
        self.decay_low_rank_dim = decay_low_rank_dim or max(32, int(round(2.5 * root * factor / 32) * 32))
        self.gate_low_rank_dim = gate_low_rank_dim or max(32, int(round(5 * root / 32) * 32))
        self.a_low_rank_dim = a_low_rank_dim or max(32, int(round(2.5 * root * factor / 32) * 32))
        self.v_low_rank_dim = v_low_rank_dim or max(32, int(round(1.7 * root * factor / 32) * 32))

        for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            setattr(self, name, nn.Parameter(torch.zeros(1, 1, hidden_size)))
        self.k_k = nn.Parameter(torch.zeros(self.key_dim))
        self.k_a = nn.Parameter(torch.zeros(self.key_dim))
        self.r_k = nn.Parameter(torch.zeros(self.num_heads, self.head_dim))
        self.r_proj = ColumnParallelLinear(hidden_size, self.key_dim, bias=False)
        self.k_proj = ColumnParallelLinear(hidden_size, self.key_dim, bias=False)
        self.v_proj = ColumnParallelLinear(hidden_size, self.value_dim, bias=False)
        self.o_proj = RowParallelLinear(self.value_dim, hidden_size, bias=False)
        self.w_lora = LoRA(hidden_size, self.key_dim, self.decay_low_rank_dim, activation="tanh")
        if self.layer_idx != 0:
            self.v_lora = LoRA(hidden_size, self.value_dim, self.v_low_rank_dim, activation=None)
        self.a_lora = LoRA(hidden_size, self.key_dim, self.a_low_rank_dim, activation=None)
        self.g_lora = LoRA(hidden_size, self.value_dim, self.gate_low_rank_dim, activation="sigmoid", bias=False)
        self.g_norm = GroupNorm(self.num_heads, self.value_dim, eps=self.head_dim * norm_eps)
        self.rwkv7 = ChunkRWKV7()
        # (shift_states [slots, hidden], recurrent_states [slots, H, K, V] float32), bound by the runner
        self.state_cache: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def forward(self, hidden_states: torch.Tensor, v_first: Optional[torch.Tensor] = None):
        return self._forward(hidden_states, v_first, native=False)

    def forward_native(self, hidden_states: torch.Tensor, v_first: Optional[torch.Tensor] = None):
        return self._forward(hidden_states, v_first, native=True)

    # ---- the layer ----------------------------------------------------------------------------------
    def _forward(self, x, v_first, native):
        meta, shift_states, states = step_states(self)
        t, h = x.shape[0], self.num_heads
        delta = self.token_shift(x, meta, shift_states) - x
        xr, xw, xk, xv, xa, xg = (torch.addcmul(x, delta, m.view(-1).to(x.dtype))
                                  for m in (self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g))
        r = run(self.r_proj, native, xr)
        w = self.log_decay(self.w_lora(xw, native))
        k = run(self.k_proj, native, xk)
        v = run(self.v_proj, native, xv)
        if self.layer_idx == 0:
            v_first = v
        else:
            if v_first is None:
                raise ValueError(f"RWKV7Attention layer {self.layer_idx} needs layer 0's v_first")
            v = torch.lerp(v, v_first, torch.sigmoid(self.v_lora(xv, native)))
        iclr = torch.sigmoid(self.a_lora(xa, native))
        g = self.g_lora(xg, native)
        kk = self.l2_norm((k * self.k_k.to(k.dtype)).view(t, h, self.head_dim))
        k = k.addcmul(k * (iclr - 1), self.k_a.to(k.dtype))

        r, w, k, iclr = (z.view(t, h, self.head_dim) for z in (r, w, k, iclr))
        v = v.view(t, h, self.head_v_dim)
        a, b = -kk, kk * iclr
        parts = [self._recurrence(r[p.tokens], w[p.tokens], k[p.tokens], v[p.tokens], a[p.tokens], b[p.tokens],
                                  states, p, native) for p in state_phases(meta, t)]
        o = torch.cat(parts) if len(parts) != 1 else parts[0]  # [T, H, V], decodes first as the tokens are

        o = self.output_gate(self.g_norm(o), r, k, v, g)
        return run(self.o_proj, native, o), v_first

    def output_gate(self, o, r, k, v, g):
        """(o + bonus) * g, [T, value_dim]: the bonus (r . (k * r_k)) v per head (FLA's
        ``gate_output_correction``), r and k [T, H, K] as the core saw them, v [T, H, V]."""
        bonus = (r * k * self.r_k.to(r.dtype)).sum(-1, keepdim=True) * v
        return (o + bonus.flatten(-2)) * g

    def token_shift(self, x: torch.Tensor, meta, shift_states: torch.Tensor) -> torch.Tensor:
        """[T, hidden]: each token's previous token within its sequence; a sequence's first token
        gets the carried row (zeros if the sequence is fresh). Writes each sequence's last token
        into its slot."""
        starts = meta.query_start_loc.long()
        slots = meta.state_slots.long() if meta.state_slots is not None else torch.arange(
            starts.numel() - 1, device=x.device)
        carried = shift_states.index_select(0, slots).to(x.dtype)
        carried = torch.where(meta.has_initial_state[:, None], carried, torch.zeros_like(carried))
        prev = torch.empty_like(x)
        prev[1:] = x[:-1]
        prev[starts[:-1]] = carried
        shift_states.index_copy_(0, slots, x.index_select(0, starts[1:] - 1).to(shift_states.dtype))
        return prev

    def log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        """w in the logits' dtype: -exp(-0.5) * sigmoid, in float32 (or wider), rounded once."""
        wide = torch.promote_types(logits.dtype, torch.float32)
        return (-MAX_LOG_DECAY * torch.sigmoid(logits.to(wide))).to(logits.dtype)

    @staticmethod
    def l2_norm(x: torch.Tensor) -> torch.Tensor:
        wide = torch.promote_types(x.dtype, torch.float32)
        h = x.to(wide)
        return (h * torch.rsqrt(h.square().sum(-1, keepdim=True) + L2_NORM_EPS)).to(x.dtype)

    def _recurrence(self, r, w, k, v, a, b, states, phase, native):
        slots = phase.slots.long()
        initial = states.index_select(0, slots)
        if phase.continues is not None:  # fresh sequences start from zeros, never from their slot's leftovers
            initial = torch.where(phase.continues[:, None, None, None], initial, torch.zeros_like(initial))
        o, final = run(self.rwkv7, native, r[None], w[None], k[None], v[None], a[None], b[None], scale=1.0,
                       initial_state=initial, output_final_state=True, cu_seqlens=phase.query_start_loc)
        states.index_copy_(0, slots, final.to(states.dtype))
        return o[0]
