# Wrong: one decay per head (the mean of the head's key-channel log decays) instead of one per key
# channel, as a scalar-gated kernel (RetNet / Mamba-2 style) would apply it.
import torch
from torch import nn


class ChunkGLA(nn.Module):
    def forward(self, q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        qf, kf, vf, gf = (x[0].float() for x in (q, k, v, g))
        per_head = gf.mean(-1)  # [T, H]
        n, h, dk, dv = cu_seqlens.numel() - 1, vf.shape[1], kf.shape[-1], vf.shape[-1]
        o, finals, ends = torch.empty_like(vf), [], cu_seqlens.tolist()
        for i in range(n):
            s = initial_state[i].float() if initial_state is not None else vf.new_zeros(h, dk, dv)
            for t in range(ends[i], ends[i + 1]):
                s = s * per_head[t].exp()[:, None, None] + kf[t][:, :, None] * vf[t][:, None, :]
                o[t] = torch.einsum("hkv,hk->hv", s, qf[t] * scale)
            finals.append(s)
        return o.to(v.dtype)[None], (torch.stack(finals) if output_final_state else None)
