# RWKV7Attention in plain PyTorch over this tree's ChunkRWKV7. The token shift is one gather from a
# [step's tokens | a zero row | the slots' carried rows] table: each token's previous row, a
# sequence's first token indexing its carried row (the zero row when the sequence is fresh). The
# six mixes are one broadcast addcmul x + delta * [6, hidden]; r/k/v and the LoRAs are written out
# as matmuls. All sequences go through one packed core call (fresh ones from zero states). The
# per-head group norm is written out in float32 and rounded once; bonus and gate follow in the
# activation dtype.
import torch
from torch import nn

from kernels_reference.forward_context import get_forward_context

from ..L1.rwkv7 import ChunkRWKV7


class _LoRA(nn.Module):
    def __init__(self, d_in, d_out, rank, act, bias=True):
        super().__init__()
        self.lora = nn.Sequential(nn.Linear(d_in, rank, bias=False), act, nn.Linear(rank, d_out, bias=bias))


class _GroupNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))


class RWKV7Attention(nn.Module):
    def __init__(self, mode="chunk", hidden_size=1024, head_dim=64, num_heads=None, decay_low_rank_dim=None,
                 gate_low_rank_dim=None, a_low_rank_dim=None, v_low_rank_dim=None, elementwise_affine=True,
                 norm_eps=1e-5, layer_idx=None, fuse_norm=False, value_dim=None, num_hidden_layers=None, **kwargs):
        super().__init__()
        c = hidden_size
        self.dk = head_dim if head_dim is not None else c // num_heads
        self.h = c // self.dk
        self.vdim = value_dim or c
        self.dv = self.vdim // self.h
        self.eps = self.dk * norm_eps
        self.first = layer_idx == 0
        ranks = {"w": decay_low_rank_dim, "a": a_low_rank_dim, "g": gate_low_rank_dim, "v": v_low_rank_dim}
        assert all(r is not None for r in ranks.values()), "pass the low-rank dims explicitly"
        for n in ("r", "w", "k", "v", "a", "g"):
            setattr(self, f"x_{n}", nn.Parameter(torch.zeros(1, 1, c)))
        self.k_k = nn.Parameter(torch.zeros(c))
        self.k_a = nn.Parameter(torch.zeros(c))
        self.r_k = nn.Parameter(torch.zeros(self.h, self.dk))
        self.r_proj = nn.Linear(c, c, bias=False)
        self.k_proj = nn.Linear(c, c, bias=False)
        self.v_proj = nn.Linear(c, self.vdim, bias=False)
        self.o_proj = nn.Linear(self.vdim, c, bias=False)
        self.w_lora = _LoRA(c, c, ranks["w"], nn.Tanh())
        if not self.first:
            self.v_lora = _LoRA(c, self.vdim, ranks["v"], nn.Identity())
        self.a_lora = _LoRA(c, c, ranks["a"], nn.Identity())
        self.g_lora = _LoRA(c, self.vdim, ranks["g"], nn.Sigmoid(), bias=False)
        self.g_norm = _GroupNorm(self.vdim)
        self.core = ChunkRWKV7()
        self.state_cache = None
        self._names = ["w", "a", "g"] + ([] if self.first else ["v"])

    def forward(self, hidden_states, v_first=None):
        meta = get_forward_context()
        shift, states = self.state_cache
        x = hidden_states
        n_tok, dev, dt = x.shape[0], x.device, x.dtype
        starts = meta.query_start_loc.long()
        lens = starts[1:] - starts[:-1]
        nseq = lens.numel()
        carried = meta.seq_lens.long() > lens
        slots = meta.state_slots.long() if meta.state_slots is not None else torch.arange(nseq, device=dev)

        # token shift: rows 0..T-1 are this step's tokens, row T is zeros, rows T+1.. the carried rows
        table = torch.cat([x, x.new_zeros(1, x.shape[1]), shift[slots].to(dt)])
        prev_idx = torch.arange(n_tok, device=dev) - 1
        first_src = torch.where(carried, n_tok + 1 + torch.arange(nseq, device=dev), torch.full_like(lens, n_tok))
        prev_idx[starts[:-1]] = first_src
        prev = table[prev_idx]
        shift[slots] = x[starts[1:] - 1].to(shift.dtype)

        mix = torch.cat([getattr(self, f"x_{n}") for n in ("r", "w", "k", "v", "a", "g")]).view(6, 1, -1)
        xr, xw, xk, xv, xa, xg = torch.addcmul(x.unsqueeze(0), (prev - x).unsqueeze(0), mix.to(dt))

        r = xr @ self.r_proj.weight.t()
        k = xk @ self.k_proj.weight.t()
        v = xv @ self.v_proj.weight.t()
        loras = {n: getattr(self, f"{n}_lora").lora for n in self._names}
        inputs = {"w": xw, "a": xa, "g": xg, "v": xv}
        low = {n: inputs[n] @ loras[n][0].weight.t() for n in self._names}
        w_log = loras["w"][2](torch.tanh(low["w"]))
        w = (torch.sigmoid(w_log.float()) * -0.6065306597126334).to(dt)
        iclr = torch.sigmoid(loras["a"][2](low["a"]))
        gate = loras["g"][2](torch.sigmoid(low["g"]))
        if self.first:
            v_first = v
        else:
            mixv = torch.sigmoid(loras["v"][2](low["v"]))
            v = v + (v_first - v) * mixv

        kh = (k * self.k_k.to(dt)).view(n_tok, self.h, self.dk).float()
        kk = (kh / torch.sqrt(kh.pow(2).sum(-1, keepdim=True) + 1e-6)).to(dt)
        k = torch.addcmul(k, k * (iclr - 1), self.k_a.to(dt))  # k (1 + (iclr - 1) k_a), one rounding fewer
        r3, w3, k3, iclr3 = (z.reshape(n_tok, self.h, self.dk) for z in (r, w, k, iclr))
        v3 = v.reshape(n_tok, self.h, self.dv)

        init = torch.where(carried[:, None, None, None], states[slots], torch.zeros((), device=dev))
        o, final = self.core(r3[None], w3[None], k3[None], v3[None], (-kk)[None], (kk * iclr3)[None], scale=1.0,
                             initial_state=init, output_final_state=True, cu_seqlens=meta.query_start_loc)
        states[slots] = final.to(states.dtype)
        o = o[0].float()

        mu = o.mean(-1, keepdim=True)
        var = (o - mu).pow(2).mean(-1, keepdim=True)
        on = ((o - mu) / torch.sqrt(var + self.eps)).reshape(n_tok, self.vdim)
        on = (on * self.g_norm.weight.float() + self.g_norm.bias.float()).to(dt)
        bonus = ((r3 * k3 * self.r_k.to(dt)).sum(-1, keepdim=True) * v3).reshape(n_tok, self.vdim)
        out = (on + bonus) * gate
        return out @ self.o_proj.weight.t(), v_first
