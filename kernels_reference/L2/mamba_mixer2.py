"""MambaMixer2 (vLLM): Mamba-2's mixer, every layer of mamba2-2.7b.

    in_proj -> [z | x | B | C | dt] -> ShortConvolution over [x | B | C] (SiLU, bias per config)
    -> SSD scan (MambaChunkScanCombined on prefill sequences, SelectiveStateUpdate on decodes),
       dt = softplus(dt + dt_bias), decay exp(dt * A), D skip
    -> RMSNormGated(y, z): norm(y * silu(z)) per group of intermediate / n_groups channels -> out_proj

The places a kernel goes wrong:

* The projection's columns are ``[z (I) | x (I) | B (G*N) | C (G*N) | dt (H)]`` with I = H * P
  (HF's ``Mamba2Mixer`` splits them as gate, xBC, dt; vLLM's in_proj is the same five shards). The
  conv runs over the contiguous ``[x | B | C]`` slice, whose channel order is the conv weight's and
  the conv-state pool's.
* ``A`` is vLLM's parameter: the checkpoint's ``A_log`` mapped to ``-exp(A_log)`` at load time.
  vLLM stores it in float32; here the module's dtype cast reaches it too, so it is upcast to
  float32 (at least) where it is used, as the kernels compute the step and the decay in float32.
* The gate comes *before* the norm (``norm_before_gate=False``) and the norm's groups are
  ``intermediate / n_groups`` wide, not per head and not the whole row once n_groups > 1.
* State: each sequence owns a slot in two pools bound as ``state_cache = (conv_states [slots,
  K - 1, conv_dim], ssm_states [slots, H, P, N])``; the step's metadata (forward context) names the
  slots (``state_slots``) and whether each sequence continues a state (``has_initial_state``). A
  continuing sequence starts from its slot, a fresh one from zeros (its slot holds whatever an
  earlier owner left), and both write their final states back; other slots are not touched.
* A step may mix phases: vLLM orders decode sequences (one token, continuing) first and prefill
  sequences after. Decodes run the conv state update and the selective state update on per-head
  dt, A, D and dt_bias broadcast over head_dim; prefills the varlen conv and the chunked scan (with
  ``dt_limit`` clamping), their offsets rebased to the prefill tokens.
"""
import math
from typing import List, Optional, Tuple

import torch
from torch import nn

from ..forward_context import AttentionMetadata, StatePhase, state_phases, step_states
from ..L1.linear import MergedColumnParallelLinear, RowParallelLinear
from ..L1.mamba_chunk_scan import MambaChunkScanCombined
from ..L1.rms_norm_gated import RMSNormGated
from ..L1.selective_state_update import SelectiveStateUpdate
from ..L1.short_convolution import ShortConvolution
from ..native import run
from ..records import RecordsInit


class MambaMixer2(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, ssm_state_size: int, conv_kernel_size: int, intermediate_size: int,
                 use_conv_bias: bool, use_bias: bool, n_groups: int = 1, num_heads: int = 128, head_dim: int = 64,
                 rms_norm_eps: float = 1e-5, activation: str = "silu", use_rms_norm: bool = True,
                 chunk_size: int = 256):
        super().__init__()
        if intermediate_size != num_heads * head_dim:
            raise ValueError(f"intermediate_size {intermediate_size} is not {num_heads} heads x {head_dim}")
        if num_heads % n_groups:
            raise ValueError(f"{num_heads} heads do not split into {n_groups} groups")
        if not use_rms_norm:
            raise ValueError("MambaMixer2 supports the gated RMSNorm only (use_rms_norm=True)")
        self.num_heads, self.head_dim, self.n_groups = num_heads, head_dim, n_groups
        self.ssm_state_size, self.intermediate_size = ssm_state_size, intermediate_size
        self.groups_state_size = n_groups * ssm_state_size
        self.conv_dim = intermediate_size + 2 * self.groups_state_size
        self.in_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size, self.groups_state_size, self.groups_state_size,
                          num_heads], bias=use_bias)
        self.conv1d = ShortConvolution(self.conv_dim, conv_kernel_size, bias=use_conv_bias, activation=activation)
        self.A = nn.Parameter(torch.empty(num_heads, dtype=torch.float32))  # -exp(A_log)
        self.D = nn.Parameter(torch.ones(num_heads))
        self.dt_bias = nn.Parameter(torch.ones(num_heads))
        self.chunk_scan = MambaChunkScanCombined(chunk_size, dt_softplus=True, dt_limit=(0.0, float("inf")))
        self.state_update = SelectiveStateUpdate(dt_softplus=True)
        self.norm = RMSNormGated(intermediate_size, eps=rms_norm_eps, group_size=intermediate_size // n_groups,
                                 norm_before_gate=False)
        self.out_proj = RowParallelLinear(intermediate_size, hidden_size, bias=use_bias)
        self.state_cache: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # bound by the runner
        with torch.no_grad():  # S4D-real initialisation, as HF and mamba-ssm start from
            self.A.copy_(-torch.arange(1, num_heads + 1, dtype=torch.float32))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=True)

    @torch.no_grad()
    def init_random_parameters(self, generator=None):
        """Random per-head parameters for a model built from a config alone, as mamba-ssm and HF
        initialise them: decay rates A = -U(1, 16), time steps dt log-uniform in [1e-3, 0.1] stored
        as dt_bias = softplus^-1(dt), D = 1. (The generic draw, 1 + noise, would make A positive:
        a state that grows instead of decaying.)"""
        dev, n = self.A.device, self.A.numel()
        self.A.copy_(-(1 + 15 * torch.rand(n, generator=generator, device=dev)))
        dt = torch.exp(torch.rand(n, generator=generator, device=dev) * (math.log(0.1) - math.log(1e-3))
                       + math.log(1e-3))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.D.fill_(1.0)

    # ---- the block ----------------------------------------------------------------------------------
    def _forward(self, hidden_states, native):
        meta, conv_states, ssm_states = step_states(self)
        t = hidden_states.shape[0]
        projected = run(self.in_proj, native, hidden_states)
        z, xbc, dt = projected.split([self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)

        parts = []
        for phase in self.plan(meta, t):
            x = xbc[phase.tokens]
            if phase.decode:  # one token per sequence, each continuing: the conv state shifts in place
                x = run(self.conv1d, native, x, conv_states, cache_indices=phase.slots)
                parts.append(self._decode_scan(x, dt[phase.tokens], ssm_states, phase.slots, native))
            else:
                x = run(self.conv1d, native, x, conv_states, query_start_loc=phase.query_start_loc,
                        cache_indices=phase.slots, has_initial_state=phase.continues)
                parts.append(self._prefill_scan(x, dt[phase.tokens], ssm_states, phase, native))
        y = torch.cat(parts) if len(parts) != 1 else parts[0]  # [T, I], decodes first as the tokens are

        return run(self.out_proj, native, run(self.norm, native, y, z))

    @staticmethod
    def plan(meta: AttentionMetadata, tokens: int) -> List[StatePhase]:
        return state_phases(meta, tokens)

    def _split_conv_output(self, xbc: torch.Tensor):
        n = xbc.shape[0]
        x, b, c = xbc.split([self.intermediate_size, self.groups_state_size, self.groups_state_size], dim=-1)
        return (x.view(n, self.num_heads, self.head_dim), b.view(n, self.n_groups, self.ssm_state_size),
                c.view(n, self.n_groups, self.ssm_state_size))

    def _a(self) -> torch.Tensor:
        return self.A.to(torch.promote_types(self.A.dtype, torch.float32))

    def _prefill_scan(self, xbc, dt, ssm_states, phase: StatePhase, native):
        x, b, c = self._split_conv_output(xbc)
        slots = phase.slots.long()
        initial = None
        if phase.any_continues:  # fresh sequences start from zeros, never from their slot's leftovers
            initial = ssm_states.index_select(0, slots)
            initial = torch.where(phase.continues[:, None, None, None], initial, torch.zeros_like(initial))
        y, final = run(self.chunk_scan, native, x, dt, self._a(), b, c, phase.query_start_loc, D=self.D,
                       z=None, dt_bias=self.dt_bias, initial_states=initial, state_dtype=ssm_states.dtype)
        ssm_states.index_copy_(0, slots, final.to(ssm_states.dtype))
        return y.reshape(xbc.shape[0], self.intermediate_size)

    def _decode_scan(self, xbc, dt, ssm_states, slots, native):
        x, b, c = self._split_conv_output(xbc)
        p, n = self.head_dim, self.ssm_state_size
        # vLLM keeps dt, A, D and dt_bias per head and broadcasts them over head_dim for the kernel.
        y = run(self.state_update, native, ssm_states, x, dt[:, :, None].expand(-1, -1, p),
                self._a()[:, None, None].expand(-1, p, n), b, c, self.D[:, None].expand(-1, p), z=None,
                dt_bias=self.dt_bias[:, None].expand(-1, p), state_batch_indices=slots)
        return y.reshape(xbc.shape[0], self.intermediate_size)
