"""Multi-head latent attention over a paged latent cache, in plain PyTorch.

Each step's latent rows [kv_c_normed | k_pe] go into the cache at the slot mapping (negative slots
skipped, without a host sync); then for every sequence its whole history is gathered through its
block table, expanded through ``kv_b_proj`` into per-head keys [k_nope | k_pe] and values, and
attended causally with float32 scores and softmax (float64 stays float64). A pure decode step (one query per sequence, as
the engine replays in CUDA graphs) runs for all sequences at once from the device-side lengths, so
it is capturable: the query is absorbed into the latent space, and each sequence's whole
block-table span is walked in chunks of latent rows (online softmax), masked past its length."""
import torch
from torch import nn

from kernels_reference.forward_context import get_forward_context

from .attention import store_rows

DECODE_CHUNK = 1024  # cache positions per step of the decode: memory is B x chunk x (latent + rope)


class _Linear(nn.Module):
    def __init__(self, fan_in, fan_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in))

    def forward(self, x):
        return x @ self.weight.t()


class MLAAttention(nn.Module):
    def __init__(self, num_heads, scale, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank):
        super().__init__()
        self.h, self.scale = num_heads, scale
        self.nope, self.rope, self.v, self.rank = qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank
        self.kv_b_proj = _Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim))
        self.kv_cache = None

    def _attend(self, q, rows, context):
        n = rows.shape[0]
        kv = self.kv_b_proj(rows[:, : self.rank]).view(n, self.h, self.nope + self.v)
        ct = torch.float64 if q.dtype == torch.float64 else torch.float32
        k = torch.cat([kv[..., : self.nope], rows[:, None, self.rank:].expand(n, self.h, self.rope)], -1).to(ct)
        scores = torch.einsum("qhd,khd->hqk", q.to(ct), k) * self.scale
        allowed = torch.arange(n, device=q.device)[None] <= torch.arange(q.shape[0], device=q.device)[:, None] + context
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        return torch.einsum("hqk,khd->qhd", probs, kv[..., self.nope:].to(ct)).to(q.dtype)

    def forward(self, q, kv_c_normed, k_pe):
        t = q.shape[0]
        q = q.reshape(t, self.h, self.nope + self.rope)
        rows = torch.cat([kv_c_normed.reshape(t, -1), k_pe.reshape(t, -1)], -1)
        meta = get_forward_context()
        if meta is None:
            return self._attend(q, rows, 0).reshape(t, -1)
        cache = self.kv_cache
        if cache is not None:
            store_rows(cache.view(-1, cache.shape[-1]), rows, meta.slot_mapping)
        if cache is not None and meta.max_query_len == 1 and t == meta.seq_lens.numel():
            return self._decode(q, cache, meta.seq_lens, meta.block_tables).reshape(t, -1)
        out = q.new_empty(t, self.h, self.v)
        start = 0
        for i, (q_len, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            a, start = start, start + q_len
            if q_len == 0:
                continue
            if cache is None:
                history = rows[a:start]
            else:
                bs = cache.shape[1]
                blocks = meta.block_tables[i, : -(-n // bs)].long()
                history = cache.index_select(0, blocks).reshape(-1, cache.shape[-1])[:n]
            out[a:start] = self._attend(q[a:start], history, n - q_len)
        return out.reshape(t, -1)

    def _decode(self, q, cache, seq_lens, block_tables):
        # Absorbed: the query goes into the latent space through kv_b_proj's key half, so each
        # cache position is read as its latent row once, never expanded per head (expanding took
        # tens of GB at DeepSeek-V2-Lite's width and the engine's 1024-sequence decode bucket). The
        # tables' whole span is walked in chunks with a running max and sum (online softmax): a
        # CUDA graph knows no lengths.
        b, bs = q.shape[0], cache.shape[1]
        ct = torch.float64 if q.dtype == torch.float64 else torch.float32
        w = self.kv_b_proj.weight.to(ct).view(self.h, self.nope + self.v, self.rank)
        q_latent = torch.einsum("bhn,hnr->bhr", q[..., : self.nope].to(ct), w[:, : self.nope])
        q_pe, lens = q[..., self.nope:].to(ct), seq_lens.to(torch.long)
        low = torch.finfo(ct).min
        best = torch.full((b, self.h, 1), low, dtype=ct, device=q.device)
        total = torch.zeros((b, self.h, 1), dtype=ct, device=q.device)
        acc = torch.zeros((b, self.h, self.rank), dtype=ct, device=q.device)
        per = max(1, DECODE_CHUNK // bs)
        for first in range(0, block_tables.shape[1], per):
            tables = block_tables[:, first:first + per].long()
            n = tables.shape[1] * bs
            rows = cache[tables].reshape(b, n, cache.shape[-1]).to(ct)
            latent = rows[..., : self.rank]
            seen = (first * bs + torch.arange(n, device=q.device))[None, :] < lens[:, None]
            scores = (torch.einsum("bhr,bsr->bhs", q_latent, latent)
                      + torch.einsum("bhp,bsp->bhs", q_pe, rows[..., self.rank:])) * self.scale
            scores = scores.masked_fill(~seen[:, None, :], low)
            new_best = torch.maximum(best, scores.amax(-1, keepdim=True))
            probs = torch.exp(scores - new_best) * seen[:, None, :]
            rescale = torch.exp(best - new_best)
            total = total * rescale + probs.sum(-1, keepdim=True)
            acc = acc * rescale + torch.einsum("bhs,bsr->bhr", probs, latent)
            best = new_best
        out_latent = acc / total.clamp_min(torch.finfo(ct).tiny)  # length 0: 0 / tiny = 0
        return torch.einsum("bhr,hvr->bhv", out_latent, w[:, self.nope:]).to(q.dtype)
