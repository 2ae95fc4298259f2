"""Gated linear attention as its definition: one token at a time, per sequence and head.

The state S is [K, V] (keys index rows, flash-linear-attention's default layout). For each token,
with g_t the per-key-channel log decay (<= 0):

    S <- diag(exp(g_t)) S + k_t v_t^T       each key row decays at its own rate, then the write
    o_t = S^T (q_t * scale)                 read with the updated state (the token sees itself)

Computed in float32 for half inputs and in float64 for float64 inputs (the suite's truth).
"""
from typing import Optional, Tuple

import torch

from ...dispatch import compute_dtype


def gla_recurrence(q, k, v, g, scale: float, initial_state: Optional[torch.Tensor], cu_seqlens: torch.Tensor
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k, g [T, H, K]; v [T, H, V]; initial_state [N, H, K, V] or None; cu_seqlens [N + 1].
    Returns o [T, H, V] (compute dtype) and the final states [N, H, K, V]."""
    dt = compute_dtype(v.dtype)
    state_dt = torch.float64 if dt == torch.float64 else torch.float32
    q, k, v, g = (x.to(state_dt) for x in (q, k, v, g))
    # per-token views for batched [H, K, 1] x [H, 1, V] writes and [H, 1, K] x [H, K, V] reads
    decay, k_col = torch.exp(g).unsqueeze(-1), k.unsqueeze(-1)
    v_row, q_row = v.unsqueeze(-2), (q * scale).unsqueeze(-2)
    n = cu_seqlens.numel() - 1
    h, kd, vd = v.shape[1], k.shape[-1], v.shape[-1]
    o = torch.empty(v.shape, dtype=dt, device=v.device)
    final = torch.empty((n, h, kd, vd), dtype=state_dt, device=v.device)
    bounds = cu_seqlens.tolist()
    for i in range(n):
        s = (initial_state[i].to(state_dt, copy=True) if initial_state is not None  # updated in place
             else torch.zeros((h, kd, vd), dtype=state_dt, device=v.device))
        for t in range(bounds[i], bounds[i + 1]):
            s.mul_(decay[t]).baddbmm_(k_col[t], v_row[t])
            o[t] = torch.bmm(q_row[t], s).squeeze(1).to(dt)
        final[i] = s
    return o, final
