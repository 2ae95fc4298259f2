"""The gated delta rule as its definition: one token at a time, per sequence and value head.

For each value head, with the key head it shares (value head h reads key head h // (Hv // Hk)):

    S <- S * exp(g_t)                       decay first (g_t <= 0, log space)
    v'_t = beta_t * (v_t - S^T k_t)         the delta: what the decayed state mispredicts
    S <- S + k_t v'_t^T                     write the correction
    o_t = S^T (q_t * scale)                 read with the updated state

S is [K, V] (keys index rows), as flash-linear-attention stores it. With ``use_qk_l2norm`` q and k
are divided by sqrt(sum(x^2) + 1e-6) before anything else (the scale multiplies the normalised q).
Computed in float32 for half inputs and in float64 for float64 inputs (the suite's truth).
"""
from typing import Optional, Tuple

import torch

from ...dispatch import compute_dtype

L2NORM_EPS = 1e-6


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def gated_delta_rule_recurrence(q, k, v, g, beta, scale: float, initial_state: Optional[torch.Tensor],
                                cu_seqlens: torch.Tensor, use_qk_l2norm: bool
                                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k [T, Hk, K]; v [T, Hv, V]; g, beta [T, Hv]; initial_state [N, Hv, K, V] or None;
    cu_seqlens [N + 1]. Returns o [T, Hv, V] (compute dtype) and the final states [N, Hv, K, V]."""
    dt = compute_dtype(v.dtype)
    state_dt = torch.float64 if dt == torch.float64 else torch.float32
    q, k, v, g, beta = (x.to(dt) for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    group = v.shape[1] // k.shape[1]
    # [T, Hv, 1, D] rows in the state's dtype: value head h reads key head h // group
    q = (q.repeat_interleave(group, dim=1) * scale).to(state_dt).unsqueeze(2)
    k = k.repeat_interleave(group, dim=1).to(state_dt).unsqueeze(2)
    v, beta = v.to(state_dt).unsqueeze(2), beta.to(state_dt)[:, :, None, None]
    decay = torch.exp(g.to(state_dt))[:, :, None, None]
    n = cu_seqlens.numel() - 1
    hv, kd, vd = v.shape[1], k.shape[-1], v.shape[-1]
    o = torch.empty((v.shape[0], hv, 1, vd), dtype=state_dt, device=v.device)
    final = torch.empty((n, hv, kd, vd), dtype=state_dt, device=v.device)
    bounds = cu_seqlens.tolist()
    for i in range(n):
        s = (initial_state[i].to(state_dt) if initial_state is not None
             else torch.zeros((hv, kd, vd), dtype=state_dt, device=v.device))
        for t in range(bounds[i], bounds[i + 1]):
            s = s * decay[t]
            delta = beta[t] * (v[t] - torch.bmm(k[t], s))  # [Hv, 1, V]
            s = torch.baddbmm(s, k[t].transpose(1, 2), delta)  # + k delta^T
            torch.bmm(q[t], s, out=o[t])
        final[i] = s
    return o.squeeze(2).to(dt), final
