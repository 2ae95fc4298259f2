# An honest gated delta rule in plain PyTorch, chunked: per sequence, blocks of 32 tokens are
# processed at once in float32. Inside a block the decayed corrections solve a unit lower
# triangular system (torch.linalg.solve_triangular), the state S [K, V] is carried between blocks,
# and decode (one token per sequence) takes the direct single-step update for all sequences at once.
import torch
from torch import nn

BLOCK = 32


def _normalized(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class GatedDeltaRule(nn.Module):
    def forward(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        out_shape, out_dtype = v.shape, v.dtype
        if cu_seqlens is None:  # B equal rows -> B packed sequences
            b, t = q.shape[:2]
            cu_seqlens = torch.arange(b + 1, device=q.device) * t
            q, k, v, g, beta = (x.reshape(1, b * t, *x.shape[2:]) for x in (q, k, v, g, beta))
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        q, k, v, g, beta = (x[0].float() for x in (q, k, v, g, beta))
        if use_qk_l2norm_in_kernel:
            q, k = _normalized(q), _normalized(k)
        share = v.shape[1] // k.shape[1]
        q = q.repeat_interleave(share, 1) * scale  # [T, Hv, K]
        k = k.repeat_interleave(share, 1)
        n, hv, dk, dv = cu_seqlens.numel() - 1, v.shape[1], k.shape[-1], v.shape[-1]
        states = (initial_state.float().clone() if initial_state is not None
                  else q.new_zeros(n, hv, dk, dv))
        if q.shape[0] == n:  # decode: one token per sequence
            states = states * g.exp()[..., None, None]
            err = v - torch.einsum("nhkv,nhk->nhv", states, k)
            states = states + k[..., None] * (beta[..., None] * err)[:, :, None, :]
            o = torch.einsum("nhkv,nhk->nhv", states, q)
        else:
            o = torch.empty_like(v)
            ends = cu_seqlens.tolist()
            for i in range(n):
                for s in range(ends[i], ends[i + 1], BLOCK):
                    e = min(s + BLOCK, ends[i + 1])
                    o[s:e], states[i] = self._block(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], states[i])
        final = states if output_final_state else None
        return o.to(out_dtype).reshape(out_shape), final

    @staticmethod
    def _block(q, k, v, g, beta, s):
        """One block of L tokens for all heads: q, k [L, H, K], v [L, H, V], g, beta [L, H], s [H, K, V]."""
        q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # [H, L, .]
        cum = g.transpose(0, 1).cumsum(-1)  # [H, L]
        bt = beta.transpose(0, 1)
        length = cum.shape[-1]
        lower = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        gap = (cum[:, :, None] - cum[:, None, :]).masked_fill(~lower, float("-inf")).exp()  # exp(b_i - b_j), j <= i
        # corrections x_i = beta_i (v_i - exp(b_i) S^T k_i - sum_{j<i} exp(b_i - b_j) (k_i.k_j) x_j)
        rhs = bt[..., None] * (v - cum.exp()[..., None] * (k @ s))
        system = torch.eye(length, device=q.device) + bt[..., None] * (k @ k.transpose(1, 2)) * gap.tril(-1)
        x = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        o = cum.exp()[..., None] * (q @ s) + ((q @ k.transpose(1, 2)) * gap) @ x
        to_end = (cum[:, -1:] - cum).exp()  # exp(b_L - b_j)
        s = cum[:, -1].exp()[:, None, None] * s + (k * to_end[..., None]).transpose(1, 2) @ x
        return o.transpose(0, 1), s
