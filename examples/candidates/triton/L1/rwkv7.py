# An honest RWKV-7 time mix in plain PyTorch, float32. The sequences of a packed batch advance in
# lockstep: step j updates the j-th token of every sequence still running, all heads at once, so a
# decode batch (one token per sequence) is one batched update and a varlen prefill costs as many
# steps as its longest sequence. Per token and head, with the [K, V] state S:
#   S <- exp(w) * S + b (a^T S) + k v^T   (a^T S taken from the state before this token's decay)
#   o = S^T (r * scale)
import torch
from torch import nn


class ChunkRWKV7(nn.Module):
    def forward(self, r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
        out_shape, out_dtype = v.shape, v.dtype
        if cu_seqlens is None:  # B equal rows -> B packed sequences
            rows, t = r.shape[:2]
            cu_seqlens = torch.arange(rows + 1, device=r.device) * t
            r, w, k, v, a, b = (x.reshape(1, rows * t, *x.shape[2:]) for x in (r, w, k, v, a, b))
        scale = r.shape[-1] ** -0.5 if scale is None else scale
        r, w, k, v, a, b = (x[0].float() for x in (r, w, k, v, a, b))
        decay, r = w.exp(), r * scale
        bounds = cu_seqlens.tolist()
        starts = torch.tensor(bounds[:-1], device=r.device)
        lengths = torch.tensor([e - s for s, e in zip(bounds[:-1], bounds[1:])], device=r.device)
        n, h, dk, dv = len(bounds) - 1, v.shape[1], k.shape[-1], v.shape[-1]
        states = (initial_state.float().clone() if initial_state is not None else v.new_zeros(n, h, dk, dv))
        o = torch.empty_like(v)
        for step in range(int(lengths.max()) if n else 0):
            live = (lengths > step).nonzero().squeeze(1)
            tok = starts[live] + step
            s = states[live]
            pulled = torch.einsum("nhk,nhkv->nhv", a[tok], s)
            s = (decay[tok][..., None] * s + b[tok][..., None] * pulled[:, :, None, :]
                 + k[tok][..., None] * v[tok][:, :, None, :])
            o[tok] = torch.einsum("nhkv,nhk->nhv", s, r[tok])
            states[live] = s
        return o.to(out_dtype).reshape(out_shape), (states if output_final_state else None)
