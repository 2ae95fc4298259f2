# An honest gated linear attention in plain PyTorch, chunked: per sequence, blocks of 32 tokens for
# all heads at once, in float32. Inside a block the pairwise per-channel decays exp(b_t - b_s)
# (b the block's cumulative log decay, only s <= t, so never above 1) weight the q.k products
# directly on a [H, L, L, K] tensor; the state S [K, V] enters through q * exp(b) and is carried to
# the next block. Decode (one token per sequence) is a single batched update for all sequences.
import torch
from torch import nn

BLOCK = 32


class ChunkGLA(nn.Module):
    def forward(self, q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        out_shape, out_dtype = v.shape, v.dtype
        if cu_seqlens is None:  # B equal rows -> B packed sequences
            b, t = q.shape[:2]
            cu_seqlens = torch.arange(b + 1, device=q.device) * t
            q, k, v, g = (x.reshape(1, b * t, *x.shape[2:]) for x in (q, k, v, g))
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        q, k, v, g = (x[0].float() for x in (q, k, v, g))
        q = q * scale
        n, h, dk, dv = cu_seqlens.numel() - 1, v.shape[1], k.shape[-1], v.shape[-1]
        states = (initial_state.float().clone() if initial_state is not None else q.new_zeros(n, h, dk, dv))
        if q.shape[0] == n:  # decode: one token per sequence
            states = states * g.exp()[..., None] + k[..., None] * v[:, :, None, :]
            o = torch.einsum("nhkv,nhk->nhv", states, q)
        else:
            o = torch.empty_like(v)
            ends = cu_seqlens.tolist()
            for i in range(n):
                for s in range(ends[i], ends[i + 1], BLOCK):
                    e = min(s + BLOCK, ends[i + 1])
                    o[s:e], states[i] = self._block(q[s:e], k[s:e], v[s:e], g[s:e], states[i])
        return o.to(out_dtype).reshape(out_shape), (states if output_final_state else None)

    @staticmethod
    def _block(q, k, v, g, s):
        """q, k, g [L, H, K], v [L, H, V], s [H, K, V] -> o [L, H, V] and the state after the block."""
        q, k, v, g = (x.transpose(0, 1) for x in (q, k, v, g))  # [H, L, .]
        cum = g.cumsum(1)
        length = cum.shape[1]
        lower = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        gap = (cum[:, :, None, :] - cum[:, None, :, :]).masked_fill(~lower[None, :, :, None], float("-inf"))
        scores = (q[:, :, None, :] * k[:, None, :, :] * gap.exp()).sum(-1)  # [H, L, L]
        o = (q * cum.exp()) @ s + scores @ v
        to_end = (cum[:, -1:, :] - cum).exp()
        s = cum[:, -1, :, None].exp() * s + (k * to_end).transpose(1, 2) @ v
        return o.transpose(0, 1), s
