"""Mamba-2's selective state space recurrence, token by token: the semantic definition that the
chunked prefill kernel and the decode update are checked against (in float64).

Per head h, with the head's group g = h // (H / G) sharing B and C:

    dt_t  = clamp(softplus(dt_t + dt_bias), dt_limit)       (softplus only with dt_softplus)
    s_t   = exp(dt_t * A) * s_{t-1} + dt_t * x_t B_t^T       s: [P, N], x_t: [P], B_t: [N]
    y_t   = s_t C_t + D * x_t                                (then * silu(z_t) when z is given)

A sequence of a packed batch starts from its initial state (zero without one) and never sees
another sequence's tokens. Production's softplus is the identity above 20 (as torch's is), and its
prefill clamps dt to ``dt_limit`` after the softplus while its decode update does not clamp.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ...dispatch import compute_dtype


def step_size(dt: torch.Tensor, dt_bias: Optional[torch.Tensor], softplus: bool,
              limit: Optional[Tuple[float, float]], compute: torch.dtype) -> torch.Tensor:
    """The discretisation step per token and head, in ``compute``."""
    dt = dt.to(compute)
    if dt_bias is not None:
        dt = dt + dt_bias.to(compute)
    if softplus:
        dt = F.softplus(dt)  # threshold 20: the identity above, as production's kernels
    if limit is not None:
        dt = dt.clamp(limit[0], limit[1])
    return dt


def heads_of_groups(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., G, N] -> [..., H, N]: each group's B (or C) repeated for the H/G heads that share it."""
    groups = t.shape[-2]
    if heads % groups:
        raise ValueError(f"{heads} heads do not split into {groups} groups")
    return t.repeat_interleave(heads // groups, dim=-2)


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             cu_seqlens: torch.Tensor, D: Optional[torch.Tensor] = None, z: Optional[torch.Tensor] = None,
             dt_bias: Optional[torch.Tensor] = None, initial_states: Optional[torch.Tensor] = None,
             dt_softplus: bool = True, dt_limit: Sequence[float] = (0.0, float("inf")),
             state_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y [T, H, P] in x's dtype, final state per sequence [S, H, P, N]) of a packed varlen batch."""
    tokens, heads, head_dim = x.shape
    compute = compute_dtype(x.dtype)
    state_dtype = state_dtype or (initial_states.dtype if initial_states is not None else
                                  torch.float64 if compute == torch.float64 else torch.float32)
    bounds = cu_seqlens.tolist()
    steps = step_size(dt, dt_bias, dt_softplus, tuple(dt_limit), compute)  # [T, H]
    decay = torch.exp(steps * A.to(compute))  # [T, H]
    inputs = steps[..., None] * x.to(compute)  # dt_t x_t, [T, H, P]
    b, c = heads_of_groups(B.to(compute), heads), heads_of_groups(C.to(compute), heads)  # [T, H, N]
    y = torch.empty((tokens, heads, head_dim), dtype=compute, device=x.device)
    finals = []
    for seq, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        state = (initial_states[seq].to(compute, copy=True) if initial_states is not None else
                 torch.zeros((heads, head_dim, B.shape[-1]), dtype=compute, device=x.device))
        for t in range(start, end):  # in place: a few small ops per token, the truth's whole cost
            state.mul_(decay[t, :, None, None]).baddbmm_(inputs[t, :, :, None], b[t, :, None, :])
            torch.bmm(state, c[t, :, :, None], out=y[t, :, :, None])
        finals.append(state)
    y = _skip_and_gate(y, x, D, z, compute)
    final = torch.stack(finals) if finals else x.new_zeros((0, heads, head_dim, B.shape[-1]))
    return y.to(x.dtype), final.to(state_dtype)


def state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, D: Optional[torch.Tensor] = None, z: Optional[torch.Tensor] = None,
                 dt_bias: Optional[torch.Tensor] = None, dt_softplus: bool = False,
                 state_batch_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One decode step: ``state[slot]`` (pool [S, H, P, N]) advanced by one token per batch row, in
    place; returns y [B, H, P]. dt [B, H, P], A [H, P, N], D and dt_bias [H, P] (vLLM passes
    per-head values broadcast to these shapes)."""
    compute = compute_dtype(x.dtype)
    rows = (state_batch_indices.long() if state_batch_indices is not None else
            torch.arange(x.shape[0], device=x.device))
    steps = step_size(dt, dt_bias, dt_softplus, None, compute)  # [B, H, P]
    s = state[rows].to(compute)
    b, c = heads_of_groups(B.to(compute), x.shape[1]), heads_of_groups(C.to(compute), x.shape[1])
    s = torch.exp(steps[..., None] * A.to(compute)) * s + (steps * x.to(compute))[..., None] * b[:, :, None, :]
    state[rows] = s.to(state.dtype)
    y = torch.matmul(s, c[..., None])[..., 0]
    return _skip_and_gate(y, x, D, z, compute).to(x.dtype)


def _skip_and_gate(y, x, D, z, compute):
    if D is not None:
        d = D.to(compute)
        y = y + x.to(compute) * (d[:, None] if d.dim() == 1 else d)
    if z is not None:
        y = y * F.silu(z.to(compute))
    return y
