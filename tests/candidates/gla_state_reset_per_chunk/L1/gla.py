# Wrong: the state is not carried from one 64-token chunk to the next (each chunk after the
# first restarts from zero), so only sequences longer than a chunk go wrong.
import torch
from torch import nn


class ChunkGLA(nn.Module):
    def forward(self, q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        qf, kf, vf, gf = (x[0].float() for x in (q, k, v, g))
        n, h, dk, dv = cu_seqlens.numel() - 1, vf.shape[1], kf.shape[-1], vf.shape[-1]
        o, finals, ends = torch.empty_like(vf), [], cu_seqlens.tolist()
        for i in range(n):
            s = initial_state[i].float() if initial_state is not None else vf.new_zeros(h, dk, dv)
            for t in range(ends[i], ends[i + 1]):
                if t > ends[i] and (t - ends[i]) % 64 == 0:
                    s = torch.zeros_like(s)
                s = s * gf[t].exp()[:, :, None] + kf[t][:, :, None] * vf[t][:, None, :]
                o[t] = torch.einsum("hkv,hk->hv", s, qf[t] * scale)
            finals.append(s)
        return o.to(v.dtype)[None], (torch.stack(finals) if output_final_state else None)
