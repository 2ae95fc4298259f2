# Wrong only in decode: the one-token-per-sequence path reads the output from the decayed state
# before the token's own k v^T is written (the prefill path is right), so only decode steps differ.
import torch
from torch import nn


class ChunkGLA(nn.Module):
    def forward(self, q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        qf, kf, vf, gf = (x[0].float() for x in (q, k, v, g))
        n, h, dk, dv = cu_seqlens.numel() - 1, vf.shape[1], kf.shape[-1], vf.shape[-1]
        states = initial_state.float().clone() if initial_state is not None else vf.new_zeros(n, h, dk, dv)
        if qf.shape[0] == n:
            states = states * gf.exp()[..., None]
            o = torch.einsum("nhkv,nhk->nhv", states, qf * scale)
            states = states + kf[..., None] * vf[:, :, None, :]
        else:
            o, ends = torch.empty_like(vf), cu_seqlens.tolist()
            for i in range(n):
                s = states[i]
                for t in range(ends[i], ends[i + 1]):
                    s = s * gf[t].exp()[:, :, None] + kf[t][:, :, None] * vf[t][:, None, :]
                    o[t] = torch.einsum("hkv,hk->hv", s, qf[t] * scale)
                states[i] = s
        return o.to(v.dtype)[None], (states if output_final_state else None)
