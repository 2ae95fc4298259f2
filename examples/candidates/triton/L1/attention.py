"""Attention over a paged KV cache, in plain PyTorch.

The step's keys/values are written into the layer's cache (``kv_cache``) at the slot mapping, then
every sequence's queries attend causally to its whole cached history. Decode steps (one query
token per sequence) run batched and read lengths and block tables from tensors only, so the step
is capturable in a CUDA graph; prefill and mixed steps loop over sequences using the host copies
of the lengths. Scores and softmax are float32 for half-precision inputs.

GQA: the query heads sharing a KV head are folded into the row dimension of one batched matmul
([kv_head, group * queries, d] x [kv_head, d, keys]) instead of repeating K and V.
"""
import torch
from torch import nn

from kernels_reference.forward_context import get_forward_context


def _compute_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def store_rows(flat, rows, slot_mapping):
    """Write row i of ``rows`` [T, W] at row ``slot_mapping[i]`` of ``flat`` [N, W]; a negative slot
    (padding) writes nothing.

    No host sync (no boolean indexing, which a CUDA-graph capture cannot run): a padded token is
    given the slot and row of the step's first real token, so it rewrites what that token writes
    (duplicates carry equal values, so the order of the writes does not matter); in a step with no
    real token it rewrites slot 0 with its own current contents.
    """
    slots = slot_mapping.reshape(-1).long()
    if slots.numel() == 0:
        return
    real = slots >= 0
    # Length-1 index tensors, not 0-d ones: indexing with a 0-d tensor reads it on the host.
    first = torch.argmax(real.to(torch.int32)).view(1)  # 0 when no token is real
    any_real = real.any()
    fill_slot = torch.where(any_real, slots.index_select(0, first).clamp(min=0), torch.zeros_like(first))
    index = torch.where(real, slots, fill_slot)
    rows = rows.reshape(slots.numel(), flat.shape[-1]).to(flat.dtype)
    fill_row = torch.where(any_real, rows.index_select(0, first), flat.index_select(0, fill_slot))
    flat.index_copy_(0, index, torch.where(real[:, None], rows, fill_row))


def _store(key, value, key_cache, value_cache, slot_mapping):
    """Each token's K and V rows into the caches at its slot (see ``store_rows``)."""
    nk, d = key_cache.shape[-2:]
    for new, cache in ((key, key_cache), (value, value_cache)):
        store_rows(cache.view(-1, nk * d), new, slot_mapping)


def _attend(q, k, v, scale, allowed):
    """q [Lq, nq, d], k/v [Lk, nk, d], allowed [Lq, Lk] bool -> [Lq, nq, d] in q's dtype."""
    lq, nq, d = q.shape
    lk, nk = k.shape[:2]
    g = nq // nk
    ct = _compute_dtype(q.dtype)
    qf = q.to(ct).reshape(lq, nk, g, d).permute(1, 2, 0, 3).reshape(nk, g * lq, d)
    kf = k.to(ct).permute(1, 2, 0)  # [nk, d, Lk]
    vf = v.to(ct).transpose(0, 1)  # [nk, Lk, d]
    scores = torch.bmm(qf, kf).mul_(scale).view(nk, g, lq, lk)
    scores.masked_fill_(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(nk, g * lq, lk)
    out = torch.bmm(probs, vf).view(nk, g, lq, d).permute(2, 0, 1, 3).reshape(lq, nq, d)
    return out.to(q.dtype)


def _causal(lq, lk, context, device):
    """Query i (at position context + i) sees keys 0 .. context + i."""
    qpos = torch.arange(lq, device=device)[:, None] + context
    return torch.arange(lk, device=device)[None, :] <= qpos


def _gather(cache, table, length):
    """One sequence's first ``length`` cached rows [length, nk, d], via its block table."""
    bs = cache.shape[1]
    blocks = table[: -(-length // bs)].long()
    return cache.index_select(0, blocks).reshape(-1, *cache.shape[2:])[:length]


DECODE_CHUNK = 2048  # cache positions per step: memory is B x chunk, whatever the tables' span


def _decode(q, kv_cache, seq_lens, block_tables, scale):
    """One query token per sequence, all sequences at once: each attends to the first seq_len
    positions of its blocks (padding rows of length 0 give zeros). The block tables' whole span is
    walked in chunks with a running max and sum (online softmax), so a CUDA graph (no host-side
    lengths) never materialises keys for every position of every sequence at once."""
    b, nq, d = q.shape
    key_cache, value_cache = kv_cache
    nk, bs = key_cache.shape[2], key_cache.shape[1]
    g = nq // nk
    ct = _compute_dtype(q.dtype)
    qf = q.to(ct).view(b, nk, g, d)
    lens = seq_lens.to(torch.long)
    low = torch.finfo(ct).min  # finite: a chunk a sequence does not reach stays NaN-free
    best = torch.full((b, nk, g, 1), low, dtype=ct, device=q.device)
    total = torch.zeros((b, nk, g, 1), dtype=ct, device=q.device)
    acc = torch.zeros((b, nk, g, d), dtype=ct, device=q.device)
    per = max(1, DECODE_CHUNK // bs)
    for first in range(0, block_tables.shape[1], per):
        blocks = block_tables[:, first:first + per].long()
        n = blocks.shape[1] * bs
        ks = key_cache[blocks].reshape(b, n, nk, d).to(ct).permute(0, 2, 3, 1)  # [B, nk, d, n]
        vs = value_cache[blocks].reshape(b, n, nk, d).to(ct).transpose(1, 2)  # [B, nk, n, d]
        seen = (first * bs + torch.arange(n, device=q.device))[None, :] < lens[:, None]  # [B, n]
        scores = torch.matmul(qf, ks).mul_(scale).masked_fill_(~seen[:, None, None, :], low)
        new_best = torch.maximum(best, scores.amax(-1, keepdim=True))
        probs = torch.exp(scores - new_best) * seen[:, None, None, :]
        rescale = torch.exp(best - new_best)
        total = total * rescale + probs.sum(-1, keepdim=True)
        acc = acc * rescale + torch.matmul(probs, vs)
        best = new_best
    out = acc / total.clamp_min(torch.finfo(ct).tiny)  # length 0: acc and total are 0 -> 0
    return out.reshape(b, nq, d).to(q.dtype)


class Attention(nn.Module):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache = None

    def forward(self, query, key, value):
        t, d = query.shape[0], self.head_size
        q = query.reshape(t, self.num_heads, d)
        k = key.reshape(t, self.num_kv_heads, d)
        v = value.reshape(t, self.num_kv_heads, d)
        meta = get_forward_context()
        if meta is None:  # no metadata: the whole batch is one causal sequence
            return _attend(q, k, v, self.scale, _causal(t, t, 0, q.device)).reshape(t, -1)
        if self.kv_cache is not None:
            _store(k, v, self.kv_cache[0], self.kv_cache[1], meta.slot_mapping)
        if self.kv_cache is not None and meta.max_query_len == 1 and t == meta.seq_lens.numel():
            return _decode(q, self.kv_cache, meta.seq_lens, meta.block_tables, self.scale).reshape(t, -1)
        out = torch.zeros_like(q)
        start = 0
        for i, (q_len, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            end, context = start + q_len, n - q_len
            if q_len and n > 0:
                if self.kv_cache is not None:
                    ks = _gather(self.kv_cache[0], meta.block_tables[i], n)
                    vs = _gather(self.kv_cache[1], meta.block_tables[i], n)
                elif context == 0:
                    ks, vs = k[start:end], v[start:end]
                else:
                    raise ValueError("a sequence with cached context needs the layer's kv_cache")
                out[start:end] = _attend(q[start:end], ks, vs, self.scale, _causal(q_len, n, context, q.device))
            start = end
        return out.reshape(t, -1)
