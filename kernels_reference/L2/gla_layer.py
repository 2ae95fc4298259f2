"""GatedLinearAttention (flash-linear-attention's ``fla.layers.gla``): the token mixer of every layer
of GLA models (fla-hub/gla-1.3B-100B), serving an engine step.

    q_proj, k_proj, v_proj -> per-head q, k [T, H, K] and v [T, H, V]
    gk = logsigmoid(gk_proj(x)) / gate_logit_normalizer     gk_proj: hidden -> rank 16 -> key_dim (+ bias)
    -> ChunkGLA(q, k, v, gk) per sequence, from and into its recurrent-state slot
    -> g_norm_swish_gate(o, g_proj(x)): RMSNorm of each head's V-wide row, times swish(g) -> o_proj

``GatedLinearAttention(mode, hidden_size, expand_k, expand_v, num_heads, ..., norm_eps,
gate_logit_normalizer, gate_low_rank_dim, clamp_min, fuse_norm, layer_idx)`` takes FLA's constructor
arguments (key_dim = hidden_size * expand_k and value_dim = hidden_size * expand_v, cut into
``num_heads`` heads); ``forward(hidden_states [T, hidden]) -> [T, hidden]`` runs one step of packed
tokens. Parameters carry FLA's checkpoint names (``q_proj``, ``k_proj``, ``v_proj``, ``g_proj``,
``gk_proj.0``, ``gk_proj.1`` (with bias), ``o_proj``, ``g_norm_swish_gate.weight``), so a checkpoint's
``model.layers.i.attn.*`` tensors load as they are.

GLA-1.3B's settings are the ones taken: no short convolution, no feature map, as many key/value
heads as query heads, the output gate with the fused norm (``use_output_gate``, ``gate_fn='swish'``,
``fuse_norm``); other settings raise. ``clamp_min`` (a floor on gk) is honoured; ``mode`` names
FLA's kernel, which here follows the phase of the step instead (below), and ``layer_idx`` is kept.

The places a kernel goes wrong:

* The decay is per key channel, not per head: gk has q's shape. It is computed in float32 and
  rounded once to the activation dtype (the form the ``ChunkGLA`` task feeds its kernels); FLA
  takes logsigmoid and the division in the activation dtype, the same function at float32/64.
* The gated norm is FLA's ``FusedRMSNormGated``: normalise first, scale by the weight, then times
  ``swish(g)`` (``RMSNormGated(head_v_dim, norm_before_gate=True)``), one group per head row, in
  float32 rounded once. Gating before the norm is a different function.
* State: each sequence owns a slot of a pool bound as ``state_cache = (recurrent_states [slots, H,
  K, V] float32,)`` -- one pool, there being no conv window -- and the step's metadata (forward
  context) names the slots (``state_slots``) and whether each sequence continues a state
  (``has_initial_state``). A continuing sequence starts from its slot, a fresh one from zeros (its
  slot holds whatever an earlier owner left), and both write their final states back; slots of
  other sequences are not touched. The state layout is [K, V] (keys index rows), FLA's default;
  FLA's layer asks its kernels for the transposed ``state_v_first`` layout, which a pool of this
  layer does not use.
* A step may mix phases: decode sequences (one token, continuing) first, prefills after, as vLLM
  orders them. Each phase is one ``ChunkGLA`` call, so on a GPU decodes take the recurrent kernel
  (FLA's ``fused_recurrent_gla``) and prefills the chunked one (``chunk_gla``), their offsets
  rebased to the phase's tokens.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..forward_context import state_phases, step_states
from ..L1.gla import ChunkGLA
from ..L1.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from ..L1.rms_norm_gated import RMSNormGated
from ..native import run
from ..records import RecordsInit

# Log-decay logits' bias range of a random init, per key channel: logsigmoid(-3) / 16 ~ -0.19 per
# token (a few tokens of memory) to logsigmoid(5) / 16 ~ -4e-4 (thousands), the spread trained heads have.
RANDOM_GATE_BIAS = (-3.0, 5.0)


class GatedLinearAttention(RecordsInit, nn.Module):
    def __init__(self, mode: str = "chunk", hidden_size: int = 1024, expand_k: float = 0.5, expand_v: float = 1.0,
                 num_heads: int = 4, num_kv_heads: Optional[int] = None, feature_map: Optional[str] = None,
                 use_short_conv: bool = False, conv_size: int = 4, conv_bias: bool = False,
                 use_output_gate: bool = True, gate_fn: str = "swish", elementwise_affine: Optional[bool] = True,
                 norm_eps: float = 1e-5, gate_logit_normalizer: int = 16, gate_low_rank_dim: int = 16,
                 clamp_min: Optional[float] = None, fuse_norm: bool = True, layer_idx: Optional[int] = None):
        super().__init__()
        if mode not in ("chunk", "fused_recurrent", "fused_chunk"):
            raise ValueError(f"GatedLinearAttention has no mode {mode!r}")
        unsupported = {"num_kv_heads": num_kv_heads not in (None, num_heads), "feature_map": feature_map is not None,
                       "use_short_conv": use_short_conv, "use_output_gate=False": not use_output_gate,
                       "gate_fn": gate_fn not in ("swish", "silu"), "fuse_norm=False": not fuse_norm,
                       "elementwise_affine=False": not elementwise_affine}
        if any(unsupported.values()):
            raise ValueError("GatedLinearAttention takes GLA-1.3B's settings only; not "
                             + ", ".join(k for k, bad in unsupported.items() if bad))
        self.mode, self.layer_idx = mode, layer_idx
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.key_dim, self.value_dim = int(hidden_size * expand_k), int(hidden_size * expand_v)
        if self.key_dim % num_heads or self.value_dim % num_heads:
            raise ValueError(f"key dim {self.key_dim} / value dim {self.value_dim} do not split into {num_heads} heads")
        self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads
        self.gate_logit_normalizer, self.clamp_min = gate_logit_normalizer, clamp_min

        self.q_proj = ColumnParallelLinear(hidden_size, self.key_dim, bias=False)
        self.k_proj = ColumnParallelLinear(hidden_size, self.key_dim, bias=False)
        self.v_proj = ColumnParallelLinear(hidden_size, self.value_dim, bias=False)
        self.g_proj = ColumnParallelLinear(hidden_size, self.value_dim, bias=False)
        # Low rank: hidden -> gate_low_rank_dim (replicated under tensor parallelism) -> key channels.
        self.gk_proj = nn.Sequential(ReplicatedLinear(hidden_size, gate_low_rank_dim, bias=False),
                                     ColumnParallelLinear(gate_low_rank_dim, self.key_dim, bias=True))
        self.gla = ChunkGLA()
        self.g_norm_swish_gate = RMSNormGated(self.head_v_dim, eps=norm_eps, group_size=None, norm_before_gate=True)
        self.o_proj = RowParallelLinear(self.value_dim, hidden_size, bias=False)
        self.state_cache: Optional[Tuple[torch.Tensor]] = None  # (recurrent_states,), bound by the runner

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=True)

    @torch.no_grad()
    def init_random_parameters(self, generator=None):
        """Decay biases for a model built from a config alone: spread per key channel over
        RANDOM_GATE_BIAS, from channels that forget within a few tokens to ones that remember
        thousands. (The generic vector draw, 1 + noise, would give every channel the same ~50-token
        memory, where a lost or stale state hardly shows.)"""
        bias = self.gk_proj[1].bias
        low, high = RANDOM_GATE_BIAS
        bias.copy_(low + (high - low) * torch.rand(bias.shape, generator=generator, device=bias.device))

    # ---- the layer ----------------------------------------------------------------------------------
    def _forward(self, hidden_states, native):
        meta, states = step_states(self)
        t = hidden_states.shape[0]
        q = run(self.q_proj, native, hidden_states).view(t, self.num_heads, self.head_k_dim)
        k = run(self.k_proj, native, hidden_states).view(t, self.num_heads, self.head_k_dim)
        v = run(self.v_proj, native, hidden_states).view(t, self.num_heads, self.head_v_dim)
        gk = self.log_decay(run(self.gk_proj[1], native, run(self.gk_proj[0], native, hidden_states)))

        parts = [self._recurrence(q[p.tokens], k[p.tokens], v[p.tokens], gk[p.tokens], states, p, native)
                 for p in state_phases(meta, t)]
        o = torch.cat(parts) if len(parts) != 1 else parts[0]  # [T, H, V], decodes first as the tokens are

        g = run(self.g_proj, native, hidden_states)
        normed = run(self.g_norm_swish_gate, native, o.reshape(t * self.num_heads, self.head_v_dim),
                     g.reshape(t * self.num_heads, self.head_v_dim))
        return run(self.o_proj, native, normed.reshape(t, self.value_dim))

    def log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        """gk [T, H, K] in the logits' dtype: logsigmoid / normaliser (and the floor ``clamp_min``)."""
        wide = torch.promote_types(logits.dtype, torch.float32)
        gk = F.logsigmoid(logits.to(wide)) / self.gate_logit_normalizer
        if self.clamp_min is not None:
            gk = torch.clamp_min(gk, self.clamp_min)
        return gk.to(logits.dtype).view(logits.shape[0], self.num_heads, self.head_k_dim)

    def _recurrence(self, q, k, v, gk, states, phase, native):
        slots = phase.slots.long()
        initial = states.index_select(0, slots)
        if phase.continues is not None:  # fresh sequences start from zeros, never from their slot's leftovers
            initial = torch.where(phase.continues[:, None, None, None], initial, torch.zeros_like(initial))
        o, final = run(self.gla, native, q[None], k[None], v[None], gk[None], initial_state=initial,
                       output_final_state=True, cu_seqlens=phase.query_start_loc)
        states.index_copy_(0, slots, final.to(states.dtype))
        return o[0]
