"""RWKV-7 ("Goose") as its definition: one token at a time, per sequence and head.

The state S is [K, V] (keys index rows, flash-linear-attention's layout). For each token, with
w_t the per-key-channel log decay (<= 0) and a_t, b_t the two vectors of the state's rank-one
correction (in the RWKV-7 layer a = -kk and b = kk * iclr, kk the L2-normalised key, so the
correction removes part of what S holds along kk: a delta rule):

    S <- diag(exp(w_t)) S + b_t (a_t^T S) + k_t v_t^T
    o_t = S^T (r_t * scale)

The correction reads the state *before* this token's decay: both terms are computed from the same
S_{t-1} (FLA's ``fused_recurrent_dplr_delta_rule`` kernel and its naive ``dplr_recurrence`` agree
on this), and the output reads the state after the token's own write.

Computed in float32 for half inputs and in float64 for float64 inputs (the suite's truth).
"""
from typing import Optional, Tuple

import torch

from ...dispatch import compute_dtype


def rwkv7_recurrence(r, w, k, v, a, b, scale: float, initial_state: Optional[torch.Tensor],
                     cu_seqlens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """r, w, k, a, b [T, H, K]; v [T, H, V]; initial_state [N, H, K, V] or None; cu_seqlens [N + 1].
    Returns o [T, H, V] (compute dtype) and the final states [N, H, K, V]."""
    dt = compute_dtype(v.dtype)
    state_dt = torch.float64 if dt == torch.float64 else torch.float32
    r, w, k, v, a, b = (x.to(state_dt) for x in (r, w, k, v, a, b))
    # per-token views for batched [H, K, 1] x [H, 1, V] products and [H, 1, K] x [H, K, V] reads
    decay, k_col, b_col = torch.exp(w).unsqueeze(-1), k.unsqueeze(-1), b.unsqueeze(-1)
    a_row, v_row, r_row = a.unsqueeze(-2), v.unsqueeze(-2), (r * scale).unsqueeze(-2)
    n = cu_seqlens.numel() - 1
    h, kd, vd = v.shape[1], k.shape[-1], v.shape[-1]
    o = torch.empty(v.shape, dtype=dt, device=v.device)
    final = torch.empty((n, h, kd, vd), dtype=state_dt, device=v.device)
    bounds = cu_seqlens.tolist()
    for i in range(n):
        s = (initial_state[i].to(state_dt, copy=True) if initial_state is not None
             else torch.zeros((h, kd, vd), dtype=state_dt, device=v.device))
        for t in range(bounds[i], bounds[i + 1]):
            removed = torch.bmm(a_row[t], s)  # [H, 1, V]: a^T S of the state before this token
            s = s * decay[t] + torch.bmm(b_col[t], removed) + torch.bmm(k_col[t], v_row[t])
            o[t] = torch.bmm(r_row[t], s).squeeze(1).to(dt)
        final[i] = s
    return o, final
