# Wrong: the state is not carried from one 64-token chunk to the next (each chunk after the
# first restarts from zero), so only sequences longer than a chunk go wrong.
import torch
from torch import nn


class ChunkRWKV7(nn.Module):
    def forward(self, r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
        scale = r.shape[-1] ** -0.5 if scale is None else scale
        out_dtype = v.dtype
        r, w, k, v, a, b = (x[0].float() for x in (r, w, k, v, a, b))
        n, h, dk, dv = cu_seqlens.numel() - 1, v.shape[1], k.shape[-1], v.shape[-1]
        o, finals, ends = torch.empty_like(v), [], cu_seqlens.tolist()
        for i in range(n):
            s = initial_state[i].float() if initial_state is not None else v.new_zeros(h, dk, dv)
            for t in range(ends[i], ends[i + 1]):
                if t > ends[i] and (t - ends[i]) % 64 == 0:
                    s = torch.zeros_like(s)
                pulled = torch.einsum("hk,hkv->hv", a[t], s)
                s = w[t].exp()[..., None] * s + b[t][..., None] * pulled[:, None] + k[t][..., None] * v[t][:, None]
                o[t] = torch.einsum("hkv,hk->hv", s, r[t] * scale)
            finals.append(s)
        return o[None].to(out_dtype), (torch.stack(finals) if output_final_state else None)
