"""Multi-head latent attention over a paged latent cache, in plain PyTorch.

Each step's latent rows [kv_c_normed | k_pe] go into the cache at the slot mapping (negative slots
skipped, without a host sync); then for every sequence its whole history is gathered through its
block table, expanded through ``kv_b_proj`` into per-head keys [k_nope | k_pe] and values, and
attended causally with float32 scores and softmax (float64 stays float64). A pure decode step (one query per sequence, as
the engine replays in CUDA graphs) runs for all sequences at once from the device-side lengths, so
it is capturable: each sequence's whole block-table span is walked in chunks (online softmax) and
masked past its length."""
import torch
from torch import nn

from kernels_reference.forward_context import get_forward_context

from .attention import store_rows

DECODE_ROWS = 16384  # sequences x cache positions per step of the decode: its memory, whatever the batch


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
        # The tables' whole span in chunks with a running max and sum (online softmax): a CUDA
        # graph knows no lengths, and expanding every position of every sequence at once through
        # kv_b_proj took tens of GB at DeepSeek-V2-Lite's real width.
        b, bs = q.shape[0], cache.shape[1]
        ct = torch.float64 if q.dtype == torch.float64 else torch.float32
        qc, lens = q.to(ct), seq_lens.to(torch.long)
        low = torch.finfo(ct).min
        best = torch.full((b, self.h, 1), low, dtype=ct, device=q.device)
        total = torch.zeros((b, self.h, 1), dtype=ct, device=q.device)
        acc = torch.zeros((b, self.h, self.v), dtype=ct, device=q.device)
        per = max(1, DECODE_ROWS // (b * bs))
        for first in range(0, block_tables.shape[1], per):
            tables = block_tables[:, first:first + per].long()
            n = tables.shape[1] * bs
            rows = cache[tables].reshape(b, n, cache.shape[-1])
            kv = self.kv_b_proj(rows[..., : self.rank]).view(b, n, self.h, self.nope + self.v)
            k = torch.cat([kv[..., : self.nope], rows[:, :, None, self.rank:].expand(b, n, self.h, self.rope)], -1)
            seen = (first * bs + torch.arange(n, device=q.device))[None, :] < lens[:, None]
            scores = (torch.einsum("bhd,bshd->bhs", qc, k.to(ct)) * self.scale).masked_fill(~seen[:, None, :], low)
            new_best = torch.maximum(best, scores.amax(-1, keepdim=True))
            probs = torch.exp(scores - new_best) * seen[:, None, :]
            rescale = torch.exp(best - new_best)
            total = total * rescale + probs.sum(-1, keepdim=True)
            acc = acc * rescale + torch.einsum("bhs,bshd->bhd", probs, kv[..., self.nope:].to(ct))
            best = new_best
        return (acc / total.clamp_min(torch.finfo(ct).tiny)).to(q.dtype)  # length 0: 0 / tiny = 0
