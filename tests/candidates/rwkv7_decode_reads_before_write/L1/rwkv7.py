# Wrong only in decode: the one-token-per-sequence path reads the output from the decayed and
# corrected state before the token's own k v^T is written (the prefill path is right), so only
# decode steps differ; the final states are right.
import torch
from torch import nn


class ChunkRWKV7(nn.Module):
    def forward(self, r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
        scale = r.shape[-1] ** -0.5 if scale is None else scale
        out_dtype = v.dtype
        r, w, k, v, a, b = (x[0].float() for x in (r, w, k, v, a, b))
        n, h, dk, dv = cu_seqlens.numel() - 1, v.shape[1], k.shape[-1], v.shape[-1]
        states = initial_state.float().clone() if initial_state is not None else v.new_zeros(n, h, dk, dv)
        if r.shape[0] == n:
            pulled = torch.einsum("nhk,nhkv->nhv", a, states)
            states = w.exp()[..., None] * states + b[..., None] * pulled[:, :, None]
            o = torch.einsum("nhkv,nhk->nhv", states, r * scale)
            states = states + k[..., None] * v[:, :, None]
            return o[None].to(out_dtype), (states if output_final_state else None)
        o, ends = torch.empty_like(v), cu_seqlens.tolist()
        for i in range(n):
            s = states[i]
            for t in range(ends[i], ends[i + 1]):
                pulled = torch.einsum("hk,hkv->hv", a[t], s)
                s = w[t].exp()[..., None] * s + b[t][..., None] * pulled[:, None] + k[t][..., None] * v[t][:, None]
                o[t] = torch.einsum("hkv,hk->hv", s, r[t] * scale)
            states[i] = s
        return o[None].to(out_dtype), (states if output_final_state else None)
