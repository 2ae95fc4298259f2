# An honest SSD prefill scan in plain PyTorch, in its matrix ("state space duality") form: per
# sequence, the tokens are padded to whole chunks; inside a chunk the output is a masked
# attention-like product L * (C B^T) applied to dt * x, where L holds the decays between positions
# (exp of differences of the cumulative log-decay); across chunks one small state recurrence.
# Everything is float32; the batch's sequences are handled one by one (host-side lengths).
import torch
import torch.nn.functional as F
from torch import nn


class MambaChunkScanCombined(nn.Module):
    def __init__(self, chunk_size, dt_softplus=True, dt_limit=(0.0, float("inf"))):
        super().__init__()
        self.chunk_size, self.dt_softplus, self.dt_limit = chunk_size, dt_softplus, dt_limit

    def forward(self, x, dt, A, B, C, cu_seqlens, D=None, z=None, dt_bias=None, initial_states=None,
                state_dtype=None):
        T, H, P = x.shape
        G, N = B.shape[1:]
        f = torch.float32
        delta = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
        if self.dt_softplus:
            delta = F.softplus(delta)
        delta = delta.clamp(self.dt_limit[0], self.dt_limit[1])
        Bh = B.float().repeat_interleave(H // G, dim=1)  # [T, H, N]
        Ch = C.float().repeat_interleave(H // G, dim=1)
        y = torch.zeros((T, H, P), dtype=f, device=x.device)
        n_seq = cu_seqlens.numel() - 1
        finals = torch.zeros((n_seq, H, P, N), dtype=f, device=x.device)
        bounds = cu_seqlens.tolist()
        for i in range(n_seq):
            a, b = bounds[i], bounds[i + 1]
            h0 = initial_states[i].float() if initial_states is not None else torch.zeros((H, P, N), device=x.device)
            if b == a:
                finals[i] = h0
                continue
            ys, finals[i] = self._sequence(x[a:b].float(), delta[a:b], A.float(), Bh[a:b], Ch[a:b], h0)
            y[a:b] = ys
        if D is not None:
            y = y + x.float() * (D.float()[:, None] if D.dim() == 1 else D.float())
        if z is not None:
            y = y * F.silu(z.float())
        if state_dtype is None:
            state_dtype = initial_states.dtype if initial_states is not None else torch.float32
        return y.to(x.dtype), finals.to(state_dtype)

    def _sequence(self, x, delta, A, B, C, h0):
        L = self.chunk_size
        n = x.shape[0]
        pad = (-n) % L
        if pad:  # padded steps have dt = 0: no decay, no input
            x, delta, B, C = (F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) for t in (x, delta, B, C))
        k = x.shape[0] // L
        H = x.shape[1]
        xc = x.view(k, L, H, -1)
        dc = delta.view(k, L, H)
        Bc, Cc = B.view(k, L, H, -1), C.view(k, L, H, -1)
        logdecay = torch.cumsum(dc * A, dim=1)  # [k, L, H]
        # decay from position j to position i (i >= j) inside each chunk
        diff = logdecay[:, :, None, :] - logdecay[:, None, :, :]  # [k, i, j, H]
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()[None, :, :, None]
        Lmat = torch.where(causal, diff, float("-inf")).exp()
        scores = torch.einsum("kihn,kjhn->kijh", Cc, Bc) * Lmat * dc[:, None, :, :]
        y = torch.einsum("kijh,kjhp->kihp", scores, xc)
        # what each chunk adds to the state, decayed to its end
        tail = (logdecay[:, -1:, :] - logdecay).exp() * dc  # [k, L, H]
        added = torch.einsum("klh,klhp,klhn->khpn", tail, xc, Bc)
        entering = []
        h = h0
        for c in range(k):
            entering.append(h)
            h = logdecay[c, -1, :, None, None].exp() * h + added[c]
        hin = torch.stack(entering)  # [k, H, P, N]
        y = y + torch.einsum("klhn,khpn->klhp", Cc, hin) * logdecay.exp()[..., None]
        return y.reshape(k * L, H, -1)[:n], h
