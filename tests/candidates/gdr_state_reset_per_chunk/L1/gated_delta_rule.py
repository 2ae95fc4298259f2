# Wrong: the state is not carried from one 64-token chunk to the next (each chunk after the
# first restarts from zero), so only sequences longer than a chunk go wrong.
import torch
from torch import nn


def _normalized(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class GatedDeltaRule(nn.Module):
    def forward(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        qf, kf, vf, gf, bf = (x[0].float() for x in (q, k, v, g, beta))
        if use_qk_l2norm_in_kernel:
            qf, kf = _normalized(qf), _normalized(kf)
        share = vf.shape[1] // kf.shape[1]
        qf, kf = qf.repeat_interleave(share, 1) * scale, kf.repeat_interleave(share, 1)
        n, hv, dk, dv = cu_seqlens.numel() - 1, vf.shape[1], kf.shape[-1], vf.shape[-1]
        o, finals, ends = torch.empty_like(vf), [], cu_seqlens.tolist()
        for i in range(n):
            s = initial_state[i].float() if initial_state is not None else vf.new_zeros(hv, dk, dv)
            for t in range(ends[i], ends[i + 1]):
                if t > ends[i] and (t - ends[i]) % 64 == 0:
                    s = torch.zeros_like(s)
                decay = gf[t].exp()[:, None, None]
                s = s * decay
                delta = bf[t][:, None] * (vf[t] - torch.einsum("hkv,hk->hv", s, kf[t]))
                s = s + kf[t][:, :, None] * delta[:, None, :]
                o[t] = torch.einsum("hkv,hk->hv", s, qf[t])
            finals.append(s)
        return o.to(v.dtype)[None], (torch.stack(finals) if output_final_state else None)
