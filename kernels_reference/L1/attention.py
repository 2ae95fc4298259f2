"""Attention over a paged KV cache, as vLLM's ``Attention`` layer calls FlashAttention.

``Attention(num_heads, head_size, scale, num_kv_heads)``; ``forward(query[T, nq*d], key[T, nk*d],
value[T, nk*d]) -> [T, nq*d]``. Metadata comes from the forward context
(:mod:`kernels_reference.forward_context`): the step's new keys/values are stored into the layer's
cache at ``slot_mapping`` (``store_kv_cache``, vLLM's reshape_and_cache), then every sequence's
query tokens attend causally to its whole cached history through its block table. One code path
covers packed varlen prefill, chunked prefill that reads earlier chunks from the cache, and decode.

``kv_cache`` is ``(key_cache, value_cache)``, each [num_blocks, block_size, num_kv_heads, head_size],
bound by the model runner. Without a cache (or metadata) the layer attends causally within each
packed sequence (cu_seqlens) or, with no metadata at all, within the whole batch as one sequence.

The GPU path is the same PyTorch code for now (correct on CUDA; the Triton flash-decoding kernel and
the library prefill kernel are the production-speed work of a later issue).
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..dispatch import compute_dtype
from ..forward_context import get_forward_context
from ..records import RecordsInit


def store_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                   value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write each token's key/value into its slot (block * block_size + offset), in place."""
    nk, d = key_cache.shape[-2:]
    key_cache.view(-1, nk, d)[slot_mapping] = key.reshape(-1, nk, d).to(key_cache.dtype)
    value_cache.view(-1, nk, d)[slot_mapping] = value.reshape(-1, nk, d).to(value_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` positions of one sequence, [length, nk, d], from the paged cache."""
    block_size = cache.shape[1]
    blocks = block_table[: -(-length // block_size)].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, scale: float) -> torch.Tensor:
    """q [Lq, nq, d] at positions context..context+Lq-1 over k/v [Lk, nk, d] at 0..Lk-1."""
    compute = compute_dtype(q.dtype)
    group = q.shape[1] // k.shape[1]
    qc = q.to(compute)
    kc = k.to(compute).repeat_interleave(group, dim=1)
    vc = v.to(compute).repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", qc, kc) * scale
    q_pos = torch.arange(q.shape[0], device=q.device)[:, None] + context
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, vc).to(q.dtype)


class Attention(RecordsInit, nn.Module):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: Optional[int] = None):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return self.forward_native(query, key, value)

    def forward_native(self, query, key, value):
        t, d = query.shape[0], self.head_size
        q = query.reshape(t, self.num_heads, d)
        k = key.reshape(t, self.num_kv_heads, d)
        v = value.reshape(t, self.num_kv_heads, d)
        meta = get_forward_context()
        if meta is None:
            return causal_attention(q, k, v, 0, self.scale).reshape(t, -1)
        cache = self.kv_cache
        if cache is not None:
            store_kv_cache(k, v, cache[0], cache[1], meta.slot_mapping)
        out = torch.empty_like(q)
        a = 0
        for i, (q_len, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            b = a + q_len
            context = n - q_len
            if cache is not None:
                ks = gather_kv(cache[0], meta.block_tables[i], n)
                vs = gather_kv(cache[1], meta.block_tables[i], n)
            elif context == 0:
                ks, vs = k[a:b], v[a:b]
            else:
                raise ValueError("a sequence with cached context needs the layer's kv_cache")
            out[a:b] = causal_attention(q[a:b], ks, vs, context, self.scale)
            a = b
        return out.reshape(t, -1)
