"""Qwen3NextGatedDeltaNet (vLLM): Qwen3-Next's linear-attention block, three layers in four.

    in_proj_qkvz, in_proj_ba -> per-key-head unpacking -> ShortConvolution over [q | k | v] (SiLU)
    -> beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)
    -> GatedDeltaRule (q/k L2-normed in the kernel) -> RMSNormGated(o, z) per value head -> out_proj

The places a kernel goes wrong:

* The projections are stored per key head, not per kind. ``in_proj_qkvz``'s output is Hk groups of
  ``[q_h (K) | k_h (K) | v (r * V) | z (r * V)]`` where r = Hv / Hk value heads share key head h;
  ``in_proj_ba``'s is Hk groups of ``[b (r) | a (r)]`` (HF ``fix_query_key_value_ordering``,
  vLLM's interleaved GQA layout). Unpacked, q/k/v are laid out head-major again and concatenated as
  ``[all q | all k | all v]``, the channel order of the conv weight and the conv-state pool.
* State: each sequence owns a slot in two pools bound as ``state_cache = (conv_states [slots, K - 1,
  conv_dim], ssm_states [slots, Hv, K, V] float32)``; the step's metadata (forward context) names
  the slots (``state_slots``) and whether each sequence continues a state (``has_initial_state``).
  A continuing sequence starts from its slot, a fresh one from zeros (its slot holds whatever an
  earlier owner left), and both write their final states back; slots of other sequences are not
  touched.
* A step may mix phases: vLLM orders decode sequences (one token, continuing) first and prefill
  sequences after. Decodes run the conv state update and the recurrent kernel; prefills the varlen
  conv and the chunked kernel, with their offsets rebased to the prefill tokens.
* The gated norm is HF's ``Qwen3NextRMSNormGated``: norm first, then ``* silu(z)``, one group per
  value-head row, and a plain weight (initialised to ones, *not* zero-centred like the block's
  neighbouring ``Qwen3NextRMSNorm``) -- ``RMSNormGated(head_v_dim, norm_before_gate=True)``.
  HF rounds the normed row to the activation dtype before the weight; vLLM (and we) stay in
  float32 until the end, which is the same function at float32/float64.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import use_fast_path
from ..forward_context import state_phases, step_states
from ..L1.gated_delta_rule import GatedDeltaRule
from ..L1.linear import MergedColumnParallelLinear, RowParallelLinear
from ..L1.rms_norm_gated import RMSNormGated
from ..L1.short_convolution import ShortConvolution
from ..native import run
from ..ops.gated_delta.gating import gdn_gating, triton
from ..records import RecordsInit


class Qwen3NextGatedDeltaNet(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                 conv_kernel_size: int = 4, rms_norm_eps: float = 1e-6):
        super().__init__()
        if num_v_heads % num_k_heads:
            raise ValueError(f"{num_v_heads} value heads are not a multiple of {num_k_heads} key heads")
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        # One output shard each: the checkpoint stores both fused and interleaved per key head.
        self.in_proj_qkvz = MergedColumnParallelLinear(hidden_size, [2 * self.key_dim + 2 * self.value_dim])
        self.in_proj_ba = MergedColumnParallelLinear(hidden_size, [2 * num_v_heads])
        self.conv1d = ShortConvolution(self.conv_dim, conv_kernel_size, bias=False, activation="silu")
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(num_v_heads))
        self.gated_delta_rule = GatedDeltaRule()
        self.norm = RMSNormGated(head_v_dim, eps=rms_norm_eps, group_size=None, norm_before_gate=True)
        self.out_proj = RowParallelLinear(self.value_dim, hidden_size, bias=False)
        self.state_cache: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # bound by the runner

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=True)

    @torch.no_grad()
    def init_random_parameters(self, generator=None):
        """Random gating parameters for a model built from a config alone, as HF initialises them:
        A_log = log U(1, 16) (per value head decays from slow to fast) and dt_bias = 1. (The
        generic draw, 1 + noise, would give every head the same fast decay.)"""
        dev, n = self.A_log.device, self.A_log.numel()
        self.A_log.copy_(torch.log(1 + 15 * torch.rand(n, generator=generator, device=dev)))
        self.dt_bias.fill_(1.0)

    # ---- the block ----------------------------------------------------------------------------------
    def _forward(self, hidden_states, native):
        meta, conv_states, ssm_states = step_states(self)
        t = hidden_states.shape[0]
        mixed_qkv, z = self.unpack(run(self.in_proj_qkvz, native, hidden_states))
        g, beta = self.gates(run(self.in_proj_ba, native, hidden_states), native)

        parts = []
        for phase in state_phases(meta, t):
            tokens, qsl, slots, continues, decode = (phase.tokens, phase.query_start_loc, phase.slots,
                                                     phase.continues, phase.decode)
            x = mixed_qkv[tokens]
            if decode:  # one token per sequence, each continuing: the conv state shifts in place
                x = run(self.conv1d, native, x, conv_states, cache_indices=slots)
            else:
                x = run(self.conv1d, native, x, conv_states, query_start_loc=qsl, cache_indices=slots,
                        has_initial_state=continues)
            parts.append(self._delta_rule(x, g[tokens], beta[tokens], ssm_states, qsl, slots, continues, native))
        o = torch.cat(parts) if len(parts) != 1 else parts[0]  # [T, Hv, V], decodes first as the tokens are

        normed = run(self.norm, native, o.reshape(t * self.num_v_heads, self.head_v_dim),
                     z.reshape(t * self.num_v_heads, self.head_v_dim))
        return run(self.out_proj, native, normed.reshape(t, self.value_dim))

    def unpack(self, qkvz: torch.Tensor):
        """The per-key-head groups as ``mixed_qkv [T, conv_dim]`` ([all q | all k | all v], head
        after head) and ``z [T, Hv, V]`` (value head h*r + j is the j-th of key head h's group)."""
        t, hk, r = qkvz.shape[0], self.num_k_heads, self.num_v_heads // self.num_k_heads
        kd, vd = self.head_k_dim, self.head_v_dim
        q, k, v, z = qkvz.view(t, hk, 2 * kd + 2 * r * vd).split([kd, kd, r * vd, r * vd], dim=-1)
        mixed_qkv = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        return mixed_qkv, z.reshape(t, self.num_v_heads, vd)

    def unpack_ba(self, ba: torch.Tensor):
        """``b`` and ``a [T, Hv]`` from key head h's group ``[b (r) | a (r)]``."""
        t, r = ba.shape[0], self.num_v_heads // self.num_k_heads
        b, a = ba.view(t, self.num_k_heads, 2 * r).split([r, r], dim=-1)
        return b.reshape(t, self.num_v_heads), a.reshape(t, self.num_v_heads)

    def gates(self, ba: torch.Tensor, native: bool):
        """(g [T, Hv] in float32 or wider, beta = sigmoid(b) [T, Hv] in ba's dtype)."""
        if not native and triton is not None and use_fast_path(ba, self.A_log, self.dt_bias):
            return gdn_gating(ba, self.A_log, self.dt_bias, self.num_k_heads)
        b, a = self.unpack_ba(ba)
        # float32 at least: exp(A_log) reaches 16 and softplus saturates, a half g would lose the decay.
        wide = torch.promote_types(a.dtype, torch.float32)
        g = -torch.exp(self.A_log.to(wide)) * F.softplus(a.to(wide) + self.dt_bias.to(wide))
        return g, torch.sigmoid(b)

    def _delta_rule(self, mixed_qkv, g, beta, ssm_states, qsl, slots, continues, native):
        n = mixed_qkv.shape[0]
        q, k, v = mixed_qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(1, n, self.num_k_heads, self.head_k_dim)
        k = k.reshape(1, n, self.num_k_heads, self.head_k_dim)
        v = v.reshape(1, n, self.num_v_heads, self.head_v_dim)
        slots = slots.long()
        initial = ssm_states.index_select(0, slots)
        if continues is not None:  # fresh sequences start from zeros, never from their slot's leftovers
            initial = torch.where(continues[:, None, None, None], initial, torch.zeros_like(initial))
        o, final = run(self.gated_delta_rule, native, q, k, v, g[None], beta[None], initial_state=initial,
                       output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=qsl)
        ssm_states.index_copy_(0, slots, final.to(ssm_states.dtype))
        return o[0]
